"""SWE domain: multi-turn repository-level bug fixing with tools, graded by hidden tests.

Each task is a small generated repository of two modules: `util.py` holds three helpers, `app.py` two
functions that call them (`util.mul(x, y)`). One helper carries an injected bug: an operator swap
(`a * b` -> `a + b`), a flipped comparison, an off-by-one constant, or the wrong variable returned. Helper
names say what they should do (`mul`, `inc`, `bigger`), so the fix can be inferred from the code, as in a
real repository. The issue states a symptom:

  level 1  the buggy helper is named:            "mul(3, 4) returns 7, expected 12."
  level 2  a caller in app.py is named:           "cost(3, 4) returns 7, expected 12."  (view it to find the helper)
  level 3  only "a test fails":                   run the tests to find the failing call, then navigate

The policy acts through the tool environment of `swe_env.py` (search, view, edit, test, submit). The sealed
scorer replays the episode's edits on the pristine repository and runs the hidden tests, 4 calls for each of
the repository's 5 functions, with pristine test code in the program sandbox. An episode is resolved when it
submitted and every hidden test passes. Expected values never enter the program. Sealed evaluation runs the
environment with `swe_env.SEALED` (no `history` tool), whatever the harness's `env.py` says.

Splits are assigned by a hash of the prompt (15% dev, 15% test, 70% train); dev and test hold 400 tasks each.
A task's `target` is a scripted solution episode (a JSON list of actions), used only for the SFT warm-up.
"""

from __future__ import annotations

import hashlib
import json
import random
from functools import cache

from evotrainer.trainer import episodes, swe_env
from evotrainer.trainer.domains.base import Grade, Task, split_of

LEVEL_WEIGHTS = {1: 0.35, 2: 0.40, 3: 0.25}
EVAL_SIZE = 400  # dev and test each: every item is a whole episode
ARGS = range(0, 10)

# name -> (parameters, correct body, injected bugs). Bodies are single expressions over the parameters.
HELPERS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "add": ("a, b", "a + b", ("a - b", "a * b")),
    "sub": ("a, b", "a - b", ("a + b", "b - a")),
    "mul": ("a, b", "a * b", ("a + b", "a - b")),
    "total": ("a, b", "a + b", ("a - b", "b")),
    "prod": ("a, b", "a * b", ("a + b", "a * a")),
    "bigger": ("a, b", "a if a > b else b", ("a if a < b else b",)),
    "smaller": ("a, b", "a if a < b else b", ("a if a > b else b",)),
    "first": ("a, b", "a", ("b",)),
    "second": ("a, b", "b", ("a",)),
    "inc": ("n", "n + 1", ("n + 2", "n - 1")),
    "dec": ("n", "n - 1", ("n + 1", "n - 2")),
    "double": ("n", "n * 2", ("n * 3", "n + 2")),
    "triple": ("n", "n * 3", ("n * 2", "n + 3")),
    "square": ("n", "n * n", ("n * 2", "n + n")),
    "half": ("n", "n // 2", ("n // 3", "n * 2")),
    "is_pos": ("n", "n > 0", ("n < 0", "n >= 0")),
    "is_even": ("n", "n % 2 == 0", ("n % 2 == 1",)),
    "neg": ("n", "-n", ("n",)),
}
CALLERS = ("cost", "area", "score", "price", "speed", "rank", "size", "level", "count", "value", "weight", "limit")


def _value(body: str, params: str, args: tuple) -> object:
    names = [p.strip() for p in params.split(",")]
    return eval(body, {}, dict(zip(names, args)))  # noqa: S307 - our own canonical expressions


def _args(params: str, rng: random.Random) -> tuple:
    return tuple(rng.choice(ARGS) for _ in params.split(","))


def _source(funcs: list[tuple[str, str, str]]) -> str:
    return "\n".join(f"def {name}({params}):\n    return {body}\n" for name, params, body in funcs)


def _make(level: int, rng: random.Random) -> Task:
    helpers = rng.sample(sorted(HELPERS), 3)
    buggy, bug = helpers[0], rng.choice(HELPERS[helpers[0]][2])
    callers = rng.sample(CALLERS, 2)
    rng.shuffle(helpers)
    util = [(h, HELPERS[h][0], bug if h == buggy else HELPERS[h][1]) for h in helpers]
    other = rng.choice([h for h in helpers if h != buggy])
    uses = {h: h for h in helpers}  # function -> the helper whose behaviour it has
    app = []
    for c, h in zip(callers, (buggy, other)):
        params = "x, y" if "," in HELPERS[h][0] else "x"
        app.append((c, params, f"util.{h}({params})"))
        uses[c] = h
    if rng.random() < 0.5:
        app.reverse()
    files = {"util.py": _source(util), "app.py": _source(app)}
    module = {fn: "util" if fn in helpers else "app" for fn in uses}

    def run(fn: str, args: tuple, body_of_buggy: str) -> str:
        params, body, _ = HELPERS[uses[fn]]
        return repr(_value(body_of_buggy if uses[fn] == buggy else body, params, args))

    def expected(fn: str, args: tuple) -> str:
        return run(fn, args, HELPERS[buggy][1])

    def observed(fn: str, args: tuple) -> str:
        return run(fn, args, bug)

    def draw(fn: str) -> tuple:
        return _args(HELPERS[uses[fn]][0], rng)

    named = buggy if level == 1 else next(c for c, _, _ in app if uses[c] == buggy)
    for _ in range(100):  # an example that shows the bug
        example = draw(named)
        if expected(named, example) != observed(named, example):
            break
    else:
        raise RuntimeError(f"no input separates {buggy}: {bug} from its correct body")
    issue = (f"{swe_env.call_text(named, list(example))} returns {observed(named, example)}, expected "
             f"{expected(named, example)}." if level < 3 else "a test fails.")
    passing = next(c for c, _, _ in app if uses[c] != buggy)
    pass_args = draw(passing)
    tests = [[module[named], named, list(example), expected(named, example)],
             [module[passing], passing, list(pass_args), expected(passing, pass_args)]]
    if rng.random() < 0.5:
        tests.reverse()
    hidden = []
    for fn in [*helpers, *(c for c, _, _ in app)]:
        seen: set[tuple] = set()
        while len(seen) < 4:
            seen.add(draw(fn))
        hidden += [[module[fn], fn, list(a), expected(fn, a)] for a in sorted(seen)]
    hidden.append([module[named], named, list(example), expected(named, example)])
    for variant in HELPERS[buggy][2]:  # every known wrong body of the helper fails at least one hidden test
        params, body, _ = HELPERS[buggy]
        sep = next(a for a in sorted({_args(params, rng) for _ in range(200)})
                   if _value(variant, params, a) != _value(body, params, a))
        hidden.append(["util", buggy, list(sep), repr(_value(body, params, sep))])
    prompt = (f"Issue: {issue}\nutil.py: {' '.join(h for h, _, _ in util)}\napp.py: {' '.join(c for c, _, _ in app)}"
              f"{swe_env.TURN}")
    fix = f"edit {buggy}: return {HELPERS[buggy][1]}"
    route = {1: [f"view {buggy}"], 2: [f"view {named}", f"view {buggy}"],
             3: ["test", f"view {named}", f"view {buggy}"]}[level]
    digest = hashlib.blake2b(prompt.encode(), digest_size=4).hexdigest()
    history = (f"commit {digest[:7]} change {buggy}\n-    return {HELPERS[buggy][1]}\n+    return {bug}\n"
               f"commit {digest[::-1][:7]} initial")
    return Task(id=f"S{level}:{digest}", prompt=prompt, difficulty=level, fmt="episode",
                answer=json.dumps({"files": files, "hidden": hidden}),
                target=json.dumps({"route": route, "fix": fix, "buggy": buggy, "bug": bug,
                                   "wrong": [b for b in HELPERS[buggy][2] if b != bug]}),
                columns=(("files", json.dumps(files)), ("tests", json.dumps(tests)), ("history", history)))



@cache
def _eval_split(split: str) -> tuple[Task, ...]:
    out: list[Task] = []
    for level, w in LEVEL_WEIGHTS.items():
        rng, quota, seen = random.Random(f"swe-{split}-{level}"), round(EVAL_SIZE * w), {}
        while len(seen) < quota:
            t = _make(level, rng)
            if split_of(t.prompt) == split:
                seen.setdefault(t.prompt, t)
        out.extend(seen.values())
    random.Random(f"swe-{split}-order").shuffle(out)
    return tuple(out)


def episode_columns(transcript: str, files: dict[str, str]) -> tuple[dict, dict[str, str]]:
    """The evidence of one episode, read from its text (turns, tool use, how it ended; see swe_env.replay), and
    the repository it left."""
    r = swe_env.replay(files, transcript)
    acts = r["actions"]
    return {"turns": len(acts), "tool_calls": sum(a[0] in swe_env.TOOLS for a in acts),
            "tool_errors": sum(bool(a[2]) for a in acts), "actions": json.dumps(acts), "edits": r["edits"],
            "submitted": r["submitted"], "end": r["end"], "tested_after_edit": r["tested_after_edit"],
            "leak_calls": sum(a[0] not in swe_env.SEALED_TOOLS and a[0] in swe_env.TOOLS and not a[2]
                              for a in acts),
            "transcript": transcript}, r["files"]


class SWEDomain:
    name = "swe"
    max_new_tokens = 48  # per action; an episode's length is bounded by the environment (swe_env.SEALED)
    multi_turn = True
    sealed_env = swe_env.SEALED
    sft_env = swe_env.EnvConfig(tools=swe_env.TOOLS)  # the warm-up's scripted episodes may look at the history
    sealed_columns = ("answer",)  # the pristine repository and the hidden tests
    # part of the scorer, fingerprinted with this module: the environment, and the loop sealed evaluation plays
    sealed_sources = (swe_env, episodes)
    evidence_columns = ("turns", "tool_calls", "tool_errors", "actions", "edits", "submitted", "end",
                        "tested_after_edit", "leak_calls", "transcript")

    def tasks(self, split: str, n: int | None = None, seed: int = 0) -> list[Task]:
        """dev/test: fixed sets (first n); train: n tasks sampled with `seed`, each prompt once."""
        if split in ("dev", "test"):
            return list(_eval_split(split)[:n] if n else _eval_split(split))
        if split != "train":
            raise ValueError(f"unknown split {split!r}: expected one of train, dev, test")
        rng = random.Random(f"swe-train-{seed}")
        levels, weights = list(LEVEL_WEIGHTS), list(LEVEL_WEIGHTS.values())
        out: list[Task] = []
        seen: set[str] = set()
        while len(out) < (n or 10_000):  # one draw after the other: the first n tasks do not depend on n
            t = _make(rng.choices(levels, weights)[0], rng)
            if split_of(t.prompt) == "train" and t.prompt not in seen:
                seen.add(t.prompt)
                out.append(t)
        return out

    def parse(self, completion: str, fmt: str) -> str | None:
        return completion if swe_env.END_SUBMIT in completion else None

    def score(self, completion: str, answer: str, fmt: str) -> bool:
        return self.grade([completion], [answer], [fmt])[0].correct

    def grade(self, completions: list[str], answers: list[str], fmts: list[str],
              prompts: list[str] | None = None) -> list[Grade]:
        """Replay each episode's edits on its pristine repository, run the hidden tests on the result in the
        sandbox; resolved when the episode submitted and every hidden test passes."""
        jobs, cols, submitted = [], [], []
        for c, a in zip(completions, answers):
            task = json.loads(a)
            col, files = episode_columns(c, task["files"])
            cols.append(col)
            submitted.append(col["submitted"])
            jobs.append((files, [t[:3] for t in task["hidden"]], [t[3] for t in task["hidden"]]))
        results = swe_env.sandbox_runner([(f, calls) for f, calls, _ in jobs])
        return [Grade(ok and got == want, ok, col)
                for (_, _, want), got, col, ok in zip(jobs, results, cols, submitted)]
