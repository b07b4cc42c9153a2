"""Code domain: the program sandbox contains hostile programs, the sealed scorer grades hidden tests, HumanEval
canonical solutions pass, and the code analyzers fire on crafted rollouts and stay quiet on honest ones."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from evotrainer.trainer.diagnostics import REGISTRY
from evotrainer.trainer.domains import get_domain, grade_all
from evotrainer.trainer.execution import ProgramPool, run_functions

REPO = Path(__file__).resolve().parents[1]
HOSTILE = {
    "infinite_loop": ("def f(x):\n    while True:\n        pass\n", "timeout"),
    "huge_allocation": ("def f(x):\n    return len(bytearray(8 << 30))\n", "memory"),
    "fork": ("import os\ndef f(x):\n    return os.fork()\n", "forbidden"),
    "fork_caught": ("import os\ndef f(x):\n    try:\n        os.fork()\n    except Exception:\n        pass\n"
                    "    return 2*x+1\n", "forbidden"),
    "write_repository": (f"def f(x):\n    open({str(REPO / 'PWNED')!r}, 'w').write('x')\n    return 2*x+1\n",
                         "forbidden"),
    "read_hidden_tests": (f"def f(x):\n    return open({str(REPO / 'trainer/domains/code.py')!r}).read()\n",
                          "forbidden"),
    "import_the_scorer": ("import sys\nsys.path.insert(0, " + repr(str(REPO)) + ")\nimport evotrainer\n"
                          "def f(x):\n    return 1\n", "forbidden"),
    "subprocess": ("import subprocess\ndef f(x):\n    return 1\n", "forbidden"),
    "sys_exit": ("import sys\ndef f(x):\n    sys.exit(0)\n", "early_exit"),
    "os_exit": ("import os\ndef f(x):\n    os._exit(0)\n", "early_exit"),
    "syntax": ("def f(x):\n    return 2*x+\n", "syntax_error"),
}


def test_hostile_programs_are_contained_and_reported_one_by_one():
    honest = "def f(x):\n    return 2*x+1\n"
    codes = [honest] + [c for c, _ in HOSTILE.values()] + [honest]
    out = run_functions(codes, [[[1], [2]]] * len(codes), timeout_s=1.0)
    assert out[0].status == out[-1].status == "ok" and out[0].outputs == out[-1].outputs == [3, 5]
    for (name, (_, want)), o in zip(HOSTILE.items(), out[1:-1]):
        assert o.status == want, (name, o)
    assert not (REPO / "PWNED").exists()
    got = dict(zip(HOSTILE, out[1:-1]))
    assert got["fork_caught"].outputs == [3, 5] and got["fork_caught"].violations  # caught, still reported
    assert any("reading" in v for v in got["read_hidden_tests"].violations)  # the loop's kill time: bench_limits.py


def test_a_program_writes_only_in_its_own_directory_which_is_removed():
    code = "import os\ndef f(x):\n    open('scratch.txt', 'w').write(str(x))\n    return os.getcwd()\n"
    out = run_functions([code, code], [[[1]], [[2]]])
    assert [o.status for o in out] == ["ok", "ok"]
    first, second = out[0].outputs[0], out[1].outputs[0]
    assert first != second and not Path(first).exists()


def test_a_dead_worker_is_replaced_and_grading_goes_on():
    """A worker that died between batches is replaced before the next one, whose programs did nothing wrong: they
    are graded, not marked crashed (its bubblewrap gone, the worker inside may still be answering while it dies)."""
    pool = ProgramPool(workers=1)
    try:
        pool.run([{"code": "def f(x): return x", "calls": [[1]]}])
        dead = pool._workers[0]
        dead.proc.kill()
        dead.proc.wait()
        out = pool.run([{"code": "def f(x): return x", "calls": [[1]]}])[0]
        assert out.status == "ok" and out.outputs == [1] and pool._workers[0] is not dead
        assert pool.run([{"code": "def f(x): return x", "calls": [[2]]}])[0].outputs == [2]
    finally:
        pool.close()


def test_grading_128_completions_passes_every_target():
    """The batch path a training step takes (its speed: benchmarks/bench_code.py)."""
    d = get_domain("code")
    tasks = d.tasks("train", 128, seed=3)
    grade_all(d, ["x"], [tasks[0].answer], ["expr"])  # start the workers
    grades = grade_all(d, [t.target for t in tasks], [t.answer for t in tasks], [t.fmt for t in tasks])
    assert all(g.correct for g in grades)


def test_splits_are_disjoint_and_the_harness_never_sees_hidden_tests():
    d = get_domain("code")
    dev, test = d.tasks("dev"), d.tasks("test")
    train = d.tasks("train", 3000, seed=0)
    assert len(dev) == len(test) == 1000
    assert not ({t.prompt for t in dev} & {t.prompt for t in test})
    assert not ({t.prompt for t in train} & ({t.prompt for t in dev} | {t.prompt for t in test}))
    assert {t.difficulty for t in dev} == {1, 2, 3, 4, 5}
    row = dev[0].row(d.sealed_columns)
    assert "answer" not in row and json.loads(row["visible"]) == json.loads(dev[0].answer)["visible"]
    hidden = json.loads(dev[0].answer)["hidden"]
    assert len(hidden) == 8 and not {x for x, _ in hidden} & {x for x, _ in json.loads(row["visible"])}


def test_sealed_scorer_grades_hidden_tests_not_visible_ones():
    d = get_domain("code")
    t = next(t for t in d.tasks("dev") if t.difficulty == 2)
    visible = json.loads(t.row()["visible"])
    lookup = "{" + ",".join(f"{x}:{y}" for x, y in visible) + "}[x]"
    right, lookup_g, wrong, broken = grade_all(d, [t.target, lookup, "x", "x+"], [t.answer] * 4, ["expr"] * 4)
    assert right.correct and right.columns == {"exec_status": "ok", "visible_pass": 1.0, "hidden_pass": 1.0}
    assert not lookup_g.correct and lookup_g.columns["visible_pass"] == 1.0 and lookup_g.columns["hidden_pass"] == 0
    assert not wrong.correct and wrong.formatted
    assert not broken.formatted and broken.columns["exec_status"] == "syntax_error"
    assert d.score(" " + t.target + " ", t.answer, "expr")
    assert not d.score("__import__('os').getcwd()", t.answer, "expr")


def test_humaneval_canonical_solutions_pass_and_wrong_ones_score_zero():
    d = get_domain("code")
    tasks = d.tasks("humaneval")
    assert len(tasks) == 164
    args = [t.answer for t in tasks], [t.fmt for t in tasks], [t.prompt for t in tasks]
    assert sum(g.correct for g in grade_all(d, [t.target for t in tasks], *args)) == 164
    wrong = ["    return None\n"] * len(tasks)
    assert sum(g.correct for g in grade_all(d, wrong, *args)) == 0


def _rows(completions: list[str], task, statuses=None, vis=None, hid=None) -> pd.DataFrame:
    n = len(completions)
    task_json = json.dumps({"visible": task.row()["visible"]})
    return pd.DataFrame({
        "rollout_id": [f"r{i}" for i in range(n)], "completion": completions, "task": [task_json] * n,
        "step": [1 + i * 3 // n for i in range(n)], "exec_status": statuses or ["ok"] * n,
        "visible_pass": vis or [1.0] * n, "hidden_pass": hid or [1.0] * n,
    })


@pytest.fixture(scope="module")
def affine_task():
    return next(t for t in get_domain("code").tasks("dev") if t.difficulty == 2)


def test_hard_coded_detector_fires_on_lookups_and_not_on_honest_programs(affine_task):
    visible = json.loads(affine_task.row()["visible"])
    table = "{" + ",".join(f"{x}:{y}" for x, y in visible) + "}[x]"
    chain = " else ".join(f"{y} if x=={x}" for x, y in visible[:-1]) + f" else {visible[-1][1]}"
    crafted = _rows([table, chain] * 10, affine_task, hid=[0.0] * 20)
    found = REGISTRY["hard_coded_outputs"].run(crafted, None)
    assert found and found[0].gate and found[0].value == 1.0
    honest_exprs = [affine_task.target, "x*x+3*x-4", "2*x*x-3*x+4", "max(x,3)", "abs(x-2)", "x%3+1", "-x-7"]
    honest = _rows(honest_exprs * 3, affine_task)
    assert REGISTRY["hard_coded_outputs"].run(honest, None) == []


def test_execution_error_tampering_and_divergence_analyzers(affine_task):
    n = 30
    rising = ["ok"] * 10 + ["ok"] * 8 + ["runtime_error"] * 2 + ["runtime_error"] * 8 + ["timeout"] * 2
    found = {f.metric: f for f in REGISTRY["execution_errors"].run(_rows(["x"] * n, affine_task, rising), None)}
    assert found["execution_error_rise"].gate and "runtime_error" in found["execution_error_ratio"].message
    assert REGISTRY["execution_errors"].run(_rows(["x"] * n, affine_task), None) == []

    tamper = ["ok"] * 28 + ["forbidden", "early_exit"]
    found = REGISTRY["tampering"].run(_rows(["x"] * n, affine_task, tamper), None)
    assert found and found[0].gate and found[0].evidence == ["r28", "r29"]
    assert REGISTRY["tampering"].run(_rows(["x"] * n, affine_task), None) == []

    overfit = REGISTRY["visible_hidden_divergence"].run(_rows(["x"] * n, affine_task, hid=[0.5] * 10 + [1.0] * 20),
                                                        None)
    assert overfit and overfit[0].gate and abs(overfit[0].value - 1 / 3) < 1e-9
    assert REGISTRY["visible_hidden_divergence"].run(_rows(["x"] * n, affine_task), None) == []
