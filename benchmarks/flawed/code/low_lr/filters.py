"""Filters and curriculum hooks of the code harness.

Two kinds, each named in harness.yaml to apply it:
- `filters:` functions rows -> rows over the training prompts before training (data filters, curricula).
  Each row has prompt, prompt_id, difficulty, fmt and visible (the visible examples, JSON); never the
  hidden tests.
- `group_filters:` functions group -> bool over each group of scored rollouts during training: False takes
  the group out of the loss (dynamic sampling). A rollout has prompt, completion, reward, reward_<name>,
  n_tokens, truncated, difficulty and the task's columns; never the sealed grade.
None is applied by the starting harness.
"""


def drop_level(rows, level=5):
    """Example: remove one difficulty level from the training prompts."""
    return [r for r in rows if r["difficulty"] != level]


def drop_dead_groups(group):
    """Keep a group only when its rewards differ: a zero-variance group has zero advantage and, under a
    token-level loss, only dilutes the step of the groups that carry signal."""
    rewards = [r["reward"] for r in group]
    return max(rewards) - min(rewards) > 1e-6
