"""Filters and curriculum hooks of the SWE harness.

Two kinds, each named in harness.yaml to apply it:
- `filters:` functions rows -> rows over the training issues before training (data filters, curricula).
  Each row has prompt, prompt_id, difficulty, fmt, files and tests (JSON) and history; never the hidden tests.
- `group_filters:` functions group -> bool over each group of scored episodes during training: False takes
  the group out of the loss (dynamic sampling). An episode row has prompt, completion, reward,
  reward_<name>, n_tokens, truncated, difficulty and the task's columns; never the sealed grade.
None is applied by the starting harness.
"""


def drop_level(rows, level=3):
    """Example: remove one difficulty level from the training issues."""
    return [r for r in rows if r["difficulty"] != level]


def drop_dead_groups(group):
    """Keep a group only when its rewards differ: a zero-variance group has zero advantage."""
    rewards = [r["reward"] for r in group]
    return max(rewards) - min(rewards) > 1e-6
