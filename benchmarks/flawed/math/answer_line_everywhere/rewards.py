"""Rewards of the math recipe: the answer is read from the final "Answer: N" line, the GSM8K convention."""

import re

ANSWER_LINE = re.compile(r"Answer:\s*(-?\d+)\s*$")


def final_answer(completion: str):
    """The integer on the completion's final "Answer: N" line, or None."""
    m = ANSWER_LINE.search(completion)
    return int(m.group(1)) if m else None


def correctness(prompts, completions, answer, **kwargs):
    """1.0 when the final answer equals the expected one, else 0.0."""
    out = []
    for completion, expected in zip(completions, answer):
        value = final_answer(completion)
        out.append(1.0 if value is not None and value == int(expected) else 0.0)
    return out


def answer_format(prompts, completions, **kwargs):
    """1.0 when the completion ends with an answer line, else 0.0."""
    return [1.0 if final_answer(c) is not None else 0.0 for c in completions]
