"""Data-parallel training ranks (#27): `evotrainer train --processes 2` runs two ranks under torchrun (gloo on the
CPU) in one sandbox. TRL hands each rank a contiguous slice of a step's batch, so with 12 completions a rank and
groups of 8 the middle group of every step is split across the ranks: the evidence must still be the whole batch,
once, each row with its own reward, its group's advantage and its own log-probability, and a group filter must see
and decide whole groups."""

import importlib.util
import shutil

import numpy as np
import pytest

from evotrainer.agents.offline.edits import set_knob
from evotrainer.trainer.domains import get_domain
from evotrainer.trainer.evidence import read_rollouts, read_steps
from evotrainer.workspaces import TEMPLATES

from .conftest import last_json, run_cli

STEPS, PER_RANK, GROUP = 3, 12, 8
# keeps a group by its prompt alone (so about half of them, whatever the rewards), and fails the run if it is ever
# handed a part of a group
GROUP_FILTER = '''

def keep_by_prompt(group):
    if len(group) != 8 or len({r["prompt_id"] for r in group}) != 1:
        raise ValueError(f"a group filter was handed a part of a group: {[r['prompt_id'] for r in group]}")
    return sum(map(ord, group[0]["prompt_id"])) % 2 == 0
'''


@pytest.mark.slow
def test_two_ranks_write_the_whole_batch_once_and_filter_whole_groups(tiny_policy, tmp_path):
    harness = tmp_path / "harness"
    shutil.copytree(TEMPLATES / "math", harness)
    text = (harness / "harness.yaml").read_text()
    text = set_knob(text, "per_device_train_batch_size", PER_RANK)
    (harness / "harness.yaml").write_text(text.replace("group_filters: []", "group_filters: [keep_by_prompt]"))
    with open(harness / "filters.py", "a") as f:
        f.write(GROUP_FILTER)

    proc = run_cli("train", "--domain", "math", "--steps", str(STEPS), "--processes", "2", "--harness", str(harness),
                   "--checkpoint", str(tiny_policy), "--out", str(tmp_path / "run"), "--eval-limit", "20",
                   "--eval-k", "0", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = last_json(proc.stdout)
    assert res["steps"] == STEPS and 0.0 <= res["dev_after"] <= 1.0

    rows = read_rollouts(res["evidence"]).to_pandas()
    assert len(rows) == STEPS * 2 * PER_RANK and rows.rollout_id.is_unique  # both ranks' rows, once
    assert sorted(rows.step.unique()) == list(range(1, STEPS + 1))
    groups = rows.groupby("group_id")
    assert groups.size().eq(GROUP).all() and groups.prompt_id.nunique().eq(1).all()
    assert all(sorted(g.sample_idx) == list(range(GROUP)) for _, g in groups)

    # each row's reward is its own completion's (the ranks index TRL's gathered rewards at their offset)
    spec = importlib.util.spec_from_file_location("template_rewards", TEMPLATES / "math" / "rewards.py")
    rewards = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rewards)
    tasks = {t.id: t for t in get_domain("math").tasks("train", 20_000, seed=0)}
    answers = [tasks[p].answer for p in rows.prompt_id]
    fmts = [tasks[p].fmt for p in rows.prompt_id]
    assert rows.reward_correctness.tolist() == rewards.correctness(None, rows.completion.tolist(), answers, fmts)
    assert np.allclose(rows.reward, rows.reward_correctness + 0.1 * rows.reward_answer_format)

    # each row's advantage is its group's normalised reward (TRL: (r - mean) / (std + 1e-4)), split groups included
    for _, g in groups:
        r = g.reward.to_numpy()
        assert np.allclose(g.advantage, (r - r.mean()) / (r.std(ddof=1) + 1e-4), atol=1e-4), g[["reward", "advantage"]]

    # the filter's verdict on whole groups reaches both ranks: a dropped group is out of the loss on both halves
    kept = rows.prompt_id.map(lambda p: sum(map(ord, p)) % 2 == 0)
    assert kept.any() and (~kept).any()
    assert rows.loss_masked[~kept].all()
    assert rows.loss_masked[kept].eq(rows.truncated[kept]).all()  # the template masks truncated completions
    # log-probabilities from each rank's own loss pass, gathered with the rows: none for a masked completion
    assert (rows.mean_logprob[~rows.loss_masked] < 0).all() and rows.mean_logprob[rows.loss_masked].isna().all()

    steps = read_steps(res["evidence"]).to_pandas()
    assert steps.step.tolist() == list(range(1, STEPS + 1))


@pytest.mark.slow
def test_a_failing_rank_stops_the_others_and_its_error_is_the_message(tiny_policy, tmp_path):
    """Rank 0 fails in a group filter while rank 1 waits for its verdict: torchrun stops rank 1 (nothing hangs), and
    the failure's own exception line, not torchrun's summary table, is what the user reads."""
    harness = tmp_path / "harness"
    shutil.copytree(TEMPLATES / "math", harness)
    text = set_knob((harness / "harness.yaml").read_text(), "per_device_train_batch_size", PER_RANK)
    (harness / "harness.yaml").write_text(text.replace("group_filters: []", "group_filters: [refuse]"))
    with open(harness / "filters.py", "a") as f:
        f.write("\n\ndef refuse(group):\n    raise ValueError('planted filter failure')\n")
    proc = run_cli("train", "--domain", "math", "--steps", "2", "--processes", "2", "--harness", str(harness),
                   "--checkpoint", str(tiny_policy), "--out", str(tmp_path / "run"), "--eval-limit", "10",
                   "--eval-k", "0", "--json")
    assert proc.returncode != 0
    assert "ValueError: planted filter failure" in proc.stderr.strip().splitlines()[-1], proc.stderr[-2000:]
