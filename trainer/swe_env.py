"""The SWE tool environment: one action per turn on a small repository, an observation back (DESIGN §9, §12).

An episode is text. The prompt states the issue and lists the repository's functions, and ends with the turn
marker `> `; the policy writes one action line; the environment answers with an observation that ends with the
next turn marker:

    Issue: cost(3, 4) returns 7, expected 12.
    util.py: add mul inc
    app.py: cost area
    > view cost                          <- the policy
    def cost(x, y):                      <- the environment (masked out of the loss)
        return util.mul(x, y)
    > view mul
    def mul(a, b):
        return a + b
    > edit mul: return a * b
    ok
    > test
    2 passed
    > submit

Tools address code by function name, never by line number (small policies fail to copy line numbers, DESIGN §12):
  search TEXT        lines of the source files that contain TEXT, as `file function: line`
  view NAME          the source of function NAME
  edit NAME: CODE    replace the body of NAME by the one line CODE (refused when the file would not parse)
  test               run the visible tests; the first failure is shown
  submit             end the episode; the final repository is graded
  history            the repository's version history, the commit that introduced the bug included: a leak
                     the template enables and the sealed evaluation never has

A malformed action, an unknown or disabled tool, a bad argument: an `error: ...` observation, never a crash.
The episode also ends when the turn budget is spent (`[turn limit]`) or the next observation would not fit the
context (`[context full]`). Which tools exist and the limits are an `EnvConfig`; a harness's `env.py` chooses
them, the sealed evaluation always uses `SEALED`.

This module is part of the sealed side: the scorer replays an episode's edits with `apply_edit` and runs the
hidden tests through `test_program` in the program sandbox. It imports nothing outside the standard library.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field

TOOLS = ("search", "view", "edit", "test", "submit", "history")
SEALED_TOOLS = ("search", "view", "edit", "test", "submit")
TURN = "\n> "  # ends every observation: the policy's next action follows
END_TURNS, END_CONTEXT, END_SUBMIT = "[turn limit]", "[context full]", "[submitted]"
NO_ARGUMENT = ("test", "submit", "history")
MAX_SEARCH_HITS = 4


@dataclass(frozen=True)
class EnvConfig:
    """Which tools an episode offers and its limits. `max_context` counts tokens: prompt, actions, observations."""

    tools: tuple[str, ...] = SEALED_TOOLS
    max_turns: int = 8
    max_context: int = 512
    max_action_tokens: int = 40

    def __post_init__(self):
        unknown = [t for t in self.tools if t not in TOOLS]
        if unknown:
            raise ValueError(f"unknown tool {unknown[0]!r}: the environment offers {', '.join(TOOLS)}")
        if "submit" not in self.tools:
            raise ValueError("the tool 'submit' cannot be removed: without it no episode can be graded")
        if not 1 <= self.max_turns <= 32:
            raise ValueError(f"max_turns must be between 1 and 32 (got {self.max_turns})")
        if not 64 <= self.max_context <= 8192:
            raise ValueError(f"max_context must be between 64 and 8192 tokens (got {self.max_context})")
        if not 4 <= self.max_action_tokens <= 256:
            raise ValueError(f"max_action_tokens must be between 4 and 256 (got {self.max_action_tokens})")


SEALED = EnvConfig()


def functions(files: dict[str, str]) -> dict[str, tuple[str, int, int]]:
    """Every top-level function: name -> (file, first line, last line), lines 0-based and inclusive."""
    out: dict[str, tuple[str, int, int]] = {}
    for name, src in files.items():
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                out.setdefault(node.name, (name, node.lineno - 1, node.end_lineno - 1))
    return out


def apply_edit(files: dict[str, str], arg: str) -> tuple[dict[str, str] | None, str]:
    """`edit NAME: CODE` on `files`: (the new files, 'ok') or (None, the error observation)."""
    name, sep, code = arg.partition(":")
    name, code = name.strip(), code.strip()
    if not sep or not name or not code:
        return None, "error: usage: edit NAME: CODE"
    where = functions(files).get(name)
    if where is None:
        return None, f"error: no function {name}"
    path, first, last = where
    lines = files[path].split("\n")
    header = lines[first]
    new = "\n".join([*lines[:first], header, "    " + code, *lines[last + 1:]])
    try:
        ast.parse(new)
    except (SyntaxError, ValueError):
        return None, "error: the edit does not parse"
    return {**files, path: new}, "ok"


def test_program(files: dict[str, str], calls: list[list]) -> str:
    """A program that loads the repository's modules (each sees the others by name) and defines `run_tests()`,
    which makes each call `[module, function, args]` and returns the repr of each result, or `!ErrorName`.
    Expected values never enter it: the caller compares."""
    return (
        "import types\n"
        f"_FILES = {json.dumps(files)}\n"
        f"_CALLS = {json.dumps(calls)}\n"
        "_MODS = {n[:-3]: types.ModuleType(n[:-3]) for n in _FILES}\n"
        "_BROKEN = {}\n"
        "for _n, _src in _FILES.items():\n"
        "    _m = _MODS[_n[:-3]]\n"
        "    _m.__dict__.update(_MODS)\n"
        "    try:\n"
        "        exec(compile(_src, _n, 'exec'), _m.__dict__)\n"
        "    except Exception as _e:\n"
        "        _BROKEN[_n[:-3]] = '!' + type(_e).__name__\n"
        "def run_tests():\n"
        "    out = []\n"
        "    for mod, fn, args in _CALLS:\n"
        "        if mod in _BROKEN:\n"
        "            out.append(_BROKEN[mod])\n"
        "            continue\n"
        "        try:\n"
        "            out.append(repr(getattr(_MODS[mod], fn)(*args)))\n"
        "        except Exception as e:\n"
        "            out.append('!' + type(e).__name__)\n"
        "    return out\n"
    )


def sandbox_runner(jobs: list[tuple[dict[str, str], list[list]]]) -> list[list[str]]:
    """Run many test programs in the program sandbox (any repository state an episode reached)."""
    from evotrainer.trainer.execution import pool

    outs = pool().run([{"code": test_program(f, c), "calls": [[]], "entry": "run_tests"} for f, c in jobs],
                      timeout_s=2.0)
    results = []
    for (_, calls), out in zip(jobs, outs):
        got = out.outputs[0] if out.status == "ok" and out.outputs and out.errors[0] is None else None
        results.append(got if isinstance(got, list) and len(got) == len(calls) else [f"!{out.status}"] * len(calls))
    return results


def trusted_runner(jobs: list[tuple[dict[str, str], list[list]]]) -> list[list[str]]:
    """The same programs run in this process: only for repositories the domain wrote itself (scripted SFT
    episodes), never for a policy's edits. About a thousand times faster than forking per program."""
    results = []
    for files, calls in jobs:
        ns: dict = {}
        exec(compile(test_program(files, calls), "<tests>", "exec"), ns)  # noqa: S102 - generated code only
        results.append(ns["run_tests"]())
    return results


def split_action(line: str) -> tuple[str, str]:
    """`edit mul: return a * b` -> ('edit', 'mul: return a * b'); an empty line -> ('', '')."""
    words = line.strip().split(maxsplit=1)
    return (words[0], words[1] if len(words) > 1 else "") if words else ("", "")


def call_text(fn: str, args: list) -> str:
    return f"{fn}({', '.join(map(repr, args))})"


def test_report(tests: list[list], got: list[str]) -> tuple[str, int]:
    """The observation of `test`: '2 passed' or '1 passed, 1 failed' plus the first failure; and the failure count."""
    failed = [(t, g) for t, g in zip(tests, got) if g != t[3]]
    passed = len(tests) - len(failed)
    if not failed:
        return f"{passed} passed", 0
    (_, fn, args, want), g = failed[0]
    shown = g[1:] if g.startswith("!") else g
    return f"{passed} passed, {len(failed)} failed\nFAIL {call_text(fn, args)} = {shown}, want {want}", len(failed)


@dataclass
class Episode:
    """One episode's state. `tests` are the visible tests, `[module, function, args, expected repr]`."""

    files: dict[str, str]
    tests: list[list]
    history: str
    config: EnvConfig = SEALED
    actions: list[list] = field(default_factory=list)  # [tool, arg, error] per turn
    done: bool = False
    end: str = ""
    edits: int = 0

    def step(self, line: str) -> tuple[str, str | None]:
        """Apply one action line. Returns the observation, or for `test` a placeholder and the pending test
        run (`'test'`): the caller runs a batch of them at once and finishes with `test_result`."""
        tool, arg = split_action(line)
        if tool not in self.config.tools:
            self.actions.append(["?" if tool not in TOOLS else tool, arg, True])
            shown = (tool[:20] + "...") if len(tool) > 20 else tool
            return (f"error: unknown tool {shown!r}; tools: {' '.join(self.config.tools)}" if tool
                    else "error: empty action"), None
        if tool in NO_ARGUMENT and arg:
            self.actions.append([tool, arg, True])
            return f"error: {tool} takes no argument", None
        if tool == "submit":
            self.actions.append([tool, "", False])
            self.done, self.end = True, "submit"
            return END_SUBMIT, None
        if tool == "test":
            self.actions.append([tool, "", False])
            return "", "test"
        if tool == "history":
            self.actions.append([tool, "", False])
            return self.history, None
        if tool == "view":
            where = functions(self.files).get(arg)
            if where is None:
                self.actions.append([tool, arg, True])
                return f"error: no function {arg}" if arg else "error: usage: view NAME", None
            path, first, last = where
            self.actions.append([tool, arg, False])
            return "\n".join(self.files[path].split("\n")[first:last + 1]), None
        if tool == "search":
            if not arg:
                self.actions.append([tool, arg, True])
                return "error: usage: search TEXT", None
            self.actions.append([tool, arg, False])
            return self._search(arg), None
        new, obs = apply_edit(self.files, arg)  # tool == "edit"
        self.actions.append([tool, arg, new is None])
        if new is not None:
            self.files, self.edits = new, self.edits + 1
        return obs, None

    def test_result(self, got: list[str]) -> str:
        return test_report(self.tests, got)[0]

    def _search(self, text: str) -> str:
        spans = functions(self.files)
        hits = []
        for path, src in self.files.items():
            for i, line in enumerate(src.split("\n")):
                if text in line:
                    owner = next((n for n, (p, a, b) in spans.items() if p == path and a <= i <= b), "-")
                    hits.append(f"{path} {owner}: {line.strip()}")
        if not hits:
            return "no match"
        more = f"\n({len(hits) - MAX_SEARCH_HITS} more)" if len(hits) > MAX_SEARCH_HITS else ""
        return "\n".join(hits[:MAX_SEARCH_HITS]) + more


def replay(files: dict[str, str], transcript: str) -> dict:
    """What an episode did, read back from its completion text (actions and observations): the final repository
    (its applied edits replayed on `files`) and the counts the evidence carries. Used by the sealed scorer, so
    nothing a harness reports about its episodes is trusted."""
    segments = transcript.split(TURN)
    actions, state, edits, last_edit, last_test = [], dict(files), 0, -1, -1
    end = "turn_limit"
    for i, seg in enumerate(segments):
        line, _, obs = seg.partition("\n")
        if obs.endswith(END_CONTEXT):
            end = "context"
            if obs == END_CONTEXT:
                break  # the action was cut by the context window: never run
        tool, arg = split_action(line)
        error = obs.startswith("error:") or tool not in TOOLS
        if tool == "edit" and not error:
            new, _ = apply_edit(state, arg)
            if new is not None:
                state, edits, last_edit = new, edits + 1, i
        if tool == "test" and not error:
            last_test = i
        actions.append([tool if tool in TOOLS else "?", arg, error])
        if tool == "submit" and obs.startswith(END_SUBMIT):
            end = "submit"
            break
    return {"files": state, "actions": actions, "edits": edits, "submitted": end == "submit", "end": end,
            "tested_after_edit": last_edit >= 0 and last_test > last_edit}
