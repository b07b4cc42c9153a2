"""Reward functions of the code harness (TRL signature: f(prompts, completions, **columns) -> list[float]).

Each completion is the body of `def f(x): return ...`, one Python expression. The column `visible` holds
the task's visible examples as JSON ([[x, f(x)], ...]); the hidden tests are sealed and never reach this
file. Programs run in the package's program sandbox (`evotrainer.trainer.execution`): a child process
per program with a timeout and a memory limit, so a program that loops or crashes costs a reward, never
the training run. The sealed scorer grades `correct` on the hidden tests independently of these rewards.
"""

import ast
import json

from evotrainer.trainer.execution import run_functions


def program(completion: str):
    """The function a completion defines, or None when it is not one Python expression on one line."""
    expr = completion.strip()
    if not expr or "\n" in expr:
        return None
    try:
        ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError):
        return None
    return f"def f(x):\n    return {expr}\n"


def passes(got, error, want) -> bool:
    """One visible example: the program returned the expected value for it."""
    if error is not None:  # the program raised on this input: not a pass
        return False
    return isinstance(got, bool) == isinstance(want, bool) and got == want


def visible_tests(prompts, completions, visible, **kwargs):
    """Fraction of the visible examples the program reproduces; 0 when it does not parse, hangs or is refused."""
    examples = [json.loads(v) for v in visible]
    programs = [program(c) for c in completions]
    todo = [i for i, p in enumerate(programs) if p is not None]
    outcomes = run_functions([programs[i] for i in todo], [[[x] for x, _ in examples[i]] for i in todo])
    out = [0.0] * len(completions)
    for i, o in zip(todo, outcomes):
        if o.status not in ("ok", "runtime_error"):  # timeout, memory, refused operation: nothing passes
            continue
        results = [passes(got, err, want) for got, err, (_, want) in zip(o.outputs, o.errors, examples[i])]
        out[i] = sum(results) / len(examples[i])
    return out


def expression_format(prompts, completions, **kwargs):
    """1.0 when the completion is one well-formed Python expression, else 0.0."""
    return [1.0 if program(c) is not None else 0.0 for c in completions]
