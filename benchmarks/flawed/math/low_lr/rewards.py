"""Reward functions of the math harness (TRL signature: f(prompts, completions, **columns) -> list[float]).

Every dataset column reaches these functions: `answer` (the expected integer, as text), `fmt`
("bare": the completion is the number alone; "tagged": it must end with a line "Answer: N") and
`difficulty`. The sealed scorer in the package grades `correct` independently of these rewards.
"""

import re

ANSWER_LINE = re.compile(r"Answer:\s*(-?\d+)\s*$")
BARE = re.compile(r"\s*(-?\d+)\s*")


def final_answer(completion: str, fmt: str):
    """The integer the completion gives as its final answer, or None when it does not give one."""
    m = ANSWER_LINE.search(completion) if fmt == "tagged" else BARE.fullmatch(completion)
    return int(m.group(1)) if m else None


def correctness(prompts, completions, answer, fmt, **kwargs):
    """1.0 when the final answer equals the expected one, else 0.0."""
    out = []
    for completion, expected, f in zip(completions, answer, fmt):
        value = final_answer(completion, f)
        out.append(1.0 if value is not None and value == int(expected) else 0.0)
    return out


def answer_format(prompts, completions, fmt, **kwargs):
    """1.0 when a final answer can be read in the required format, else 0.0."""
    return [1.0 if final_answer(c, f) is not None else 0.0 for c, f in zip(completions, fmt)]
