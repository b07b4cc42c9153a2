"""Filters and curriculum hooks of the math harness: functions rows -> rows over the training prompts.

Each row has prompt, prompt_id, answer, difficulty, fmt. Name a function in harness.yaml's
`filters:` list to apply it. None is applied by the starting harness.
"""


def drop_level(rows, level=4):
    """Example: remove one difficulty level from the training prompts."""
    return [r for r in rows if r["difficulty"] != level]
