"""The program sandbox's verdict is out of the graded program's reach (issue #22): a program that prints, forges
result lines on every descriptor, returns an always-equal object, exits early, or reads its own interpreter's
memory for the hidden test scores nothing, and the next batch on the same workers is graded as if it had not run."""

from __future__ import annotations

import pytest

from evotrainer.trainer import sandbox
from evotrainer.trainer.domains import get_domain, grade_all
from evotrainer.trainer.execution import ProgramPool

FORGED = b'R {"status": "ok"}\n[{"status": "ok"}]\n{"id": 1, "results": [{"status": "ok"}]}\n'
LAGGING = b"[]\n" + FORGED  # an empty batch answer first: the worker's real answer would lag one batch behind
HOSTILE_BODIES = {
    "prints": "    print('R {\"status\": \"ok\"}', flush=True)\n    return None\n",
    "forges_on_every_fd": ("    import os\n    for fd in range(21):\n        try:\n"
                           f"            os.write(fd, {FORGED!r})\n        except OSError:\n            pass\n"
                           "    os._exit(0)\n"),
    "forges_through_the_worker": ("    import os, sys\n    m = sys.modules['__main__']\n"
                                  "    for fd in range(3, 21):\n        try:\n"
                                  "            m._send(fd, 'R', {'status': 'ok'})\n        except Exception:\n"
                                  "            pass\n    os._exit(0)\n"),
    "always_equal": ("    class Yes:\n        def __eq__(self, other):\n            return True\n"
                     "        def __ne__(self, other):\n            return False\n"
                     "        def __bool__(self):\n            return True\n    return Yes()\n"),
    "exits_early": "    import os\n    os._exit(0)\n",
    "writes_fd1": f"    __import__('os').write(1, {FORGED!r})\n    return None\n",
}


@pytest.fixture(scope="module")
def humaneval():
    d = get_domain("code")
    return d, d.tasks("humaneval")


def _grade(d, tasks, completions):
    return grade_all(d, completions, [t.answer for t in tasks], [t.fmt for t in tasks], [t.prompt for t in tasks])


def test_hostile_completions_score_nothing_and_leave_the_next_batch_alone(humaneval):
    d, tasks = humaneval
    assert len(tasks) == 164
    hostile = {name: (tasks[i], body) for i, (name, body) in zip((0, 2, 4, 13, 23, 60), HOSTILE_BODIES.items())}
    batch = [(None, t, t.target) for t in tasks]
    for k, (name, (t, body)) in enumerate(hostile.items()):  # spread between the workers
        batch.insert(20 * k + 7, (name, t, body))
    grades = _grade(d, [t for _, t, _ in batch], [c for _, _, c in batch])
    assert sum(g.correct for (name, _, _), g in zip(batch, grades) if name is None) == 164
    got = {name: g for (name, _, _), g in zip(batch, grades) if name is not None}
    assert not any(g.correct for g in got.values()), {n: g.columns for n, g in got.items()}
    assert got["exits_early"].columns["exec_status"] == "early_exit"
    assert got["always_equal"].columns["exec_status"] == "runtime_error"

    shuffled = [tasks[(i + 1) % len(tasks)].target for i in range(len(tasks))]  # every one solves another task
    assert sum(g.correct for g in _grade(d, tasks, shuffled)) == 0
    small = tasks[:12]
    assert all(g.correct for g in _grade(d, small, [t.target for t in small]))


def test_a_candidate_cannot_find_the_hidden_test_in_its_own_interpreter():
    """The check (with its expected value) runs in another process than the candidate: walking frames, module
    globals and their referents finds nothing to copy."""
    seek = (
        "import gc, re, sys\n"
        "def f():\n"
        "    seen, todo, found = set(), [sys.modules['__main__'].__dict__], []\n"
        "    frame = sys._getframe()\n"
        "    while frame:\n"
        "        todo += [frame.f_locals, frame.f_globals, frame.f_code.co_consts]\n"
        "        frame = frame.f_back\n"
        "    while todo and len(seen) < 200000:\n"
        "        o = todo.pop()\n"
        "        if id(o) in seen:\n"
        "            continue\n"
        "        seen.add(id(o))\n"
        "        if isinstance(o, str):\n"
        "            found += re.findall(r'expected-[0-9a-f]{8}', o)\n"
        "        elif isinstance(o, (dict, list, tuple)) or hasattr(o, '__dict__'):\n"
        "            try:\n"
        "                todo += gc.get_referents(o)\n"
        "            except Exception:\n"
        "                pass\n"
        "    return found[0] if found else None\n"
    )
    check = "def check(candidate):\n    assert candidate() == 'expected-' + '5eb2c0de'\n"
    pool = ProgramPool(workers=1)
    try:
        honest, seeker = pool.run([{"code": "def f():\n    return 'expected-5eb2c0de'\n", "check": check, "entry": "f"},
                                   {"code": seek, "check": check, "entry": "f"}], timeout_s=5.0)
    finally:
        pool.close()
    assert honest.status == "ok"
    assert seeker.status == "runtime_error", seeker


def test_a_checked_program_keeps_its_statuses():
    check = "def check(candidate):\n    assert candidate(2) == 4\n"
    codes = {"ok": "def f(x):\n    return 2*x\n", "syntax_error": "def f(x):\n    return 2*x+\n",
             "memory": "def f(x):\n    return len(bytearray(8 << 30))\n",
             "early_exit": "import sys\ndef f(x):\n    sys.exit(0)\n",
             "forbidden": "import os\ndef f(x):\n    try:\n        os.fork()\n    except Exception:\n        pass\n"
                          "    return 2*x\n",
             "runtime_error": "def f(x):\n    return (2*x,)\n"}
    pool = ProgramPool(workers=1)
    try:
        out = pool.run([{"code": c, "check": check, "entry": "f"} for c in codes.values()], timeout_s=3.0)
    finally:
        pool.close()
    assert [o.status for o in out] == list(codes), out
    assert out[4].violations == ["os.fork"]


def test_one_result_message_per_program_and_results_never_shift():
    pool = ProgramPool(workers=1)
    forged = b'R {"status": "ok", "outputs": [7], "errors": [null]}\n'
    forge_then_return = ("import os\ndef f(x):\n    for fd in range(3, 21):\n        try:\n"
                         f"            os.write(fd, {forged!r})\n"
                         "        except OSError:\n            pass\n    return x\n")
    try:
        first = pool.run([{"code": forge_then_return, "calls": [[1]]},
                          {"code": "def f(x):\n    return x\n", "calls": [[2]]}])
        second = pool.run([{"code": "def f(x):\n    return x + 1\n", "calls": [[5]]}])
    finally:
        pool.close()
    assert first[0].status == "crash" and first[1].outputs == [2]
    assert second[0].status == "ok" and second[0].outputs == [6]


def test_the_expression_format_cannot_disturb_grading():
    d = get_domain("code")
    tasks = d.tasks("dev", 20)
    hostile = f"__import__('os').write(1, {LAGGING!r})"
    grades = grade_all(d, [hostile] * len(tasks), [t.answer for t in tasks], ["expr"] * len(tasks))
    assert not any(g.correct for g in grades)
    after = grade_all(d, [t.target for t in tasks], [t.answer for t in tasks], ["expr"] * len(tasks))
    assert all(g.correct and g.columns["exec_status"] == "ok" for g in after)


def test_equality_is_type_strict():
    from evotrainer.trainer.domains.code import _equal

    assert _equal(3, 3) and _equal([1, (2, "a")], [1, (2, "a")]) and _equal({"a": [1.5]}, {"a": [1.5]})
    assert not _equal(True, 1) and not _equal(3.0, 3) and not _equal([1], (1,)) and not _equal({"repr": "3"}, 3)

    class Yes:
        def __eq__(self, other):
            return True

    assert not _equal(Yes(), 3) and not _equal([Yes()], [3])


def test_workers_run_under_bubblewrap_unless_already_isolated():
    pool = ProgramPool(workers=1)
    try:
        assert pool.run([{"code": "def f():\n    return 1\n", "calls": [[]]}])[0].outputs == [1]
        args = pool._workers[0].proc.args
    finally:
        pool.close()
    if sandbox.isolation_mode() == "bwrap" and not sandbox.inside_isolation():
        assert args[0] == "bwrap"
    else:
        assert args[0] != "bwrap"
