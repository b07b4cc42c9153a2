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


def program(completion: str) -> str:
    """The function a completion defines: its text as the body of `def f(x): return ...`."""
    return f"def f(x):\n    return {completion.strip()}\n"


def is_expression(completion: str) -> bool:
    """Whether the completion is one Python expression on one line."""
    expr = completion.strip()
    if not expr or "\n" in expr:
        return False
    try:
        ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError):
        return False
    return True


def passes(got, error, want) -> bool:
    """One visible example: the program returned the expected value for it."""
    if error is not None:  # the program raised on this input: not a pass
        return False
    return isinstance(got, bool) == isinstance(want, bool) and got == want


def visible_tests(prompts, completions, visible, **kwargs):
    """Fraction of the visible examples the program reproduces."""
    examples = [json.loads(v) for v in visible]
    outcomes = run_functions([program(c) for c in completions], [[[x] for x, _ in ex] for ex in examples])
    out = []
    for o, ex in zip(outcomes, examples):
        if o.status != "ok":  # a syntax error, timeout, memory error or refused operation: no example passes
            out.append(0.0)
            continue
        out.append(sum(passes(got, err, want) for got, err, (_, want) in zip(o.outputs, o.errors, ex)) / len(ex))
    return out


def expression_format(prompts, completions, **kwargs):
    """1.0 when the completion is one well-formed Python expression, else 0.0."""
    return [1.0 if is_expression(c) else 0.0 for c in completions]
