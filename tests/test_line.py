"""One training line continued across jobs (#24): a line trained in pieces equals the same line trained in one job
(same tensors, same rollouts); a replicate of a kept state samples anew; a changed optimizer setting restarts the
optimizer and says so."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file

from evotrainer.base.errors import UserError
from evotrainer.trainer import jobs
from evotrainer.trainer.evidence import read_rollouts
from evotrainer.trainer.grpo import TrainSpec
from evotrainer.workspaces import TEMPLATES

HARNESS = TEMPLATES / "math"
COLS = ["step", "group_id", "sample_idx", "prompt_id", "completion", "reward", "advantage", "correct"]


def _job(root, name, start, steps, **kw) -> TrainSpec:
    return TrainSpec(domain="math", checkpoint=str(start), harness_dir=str(kw.pop("harness", HARNESS)), steps=steps,
                     seed=1, out_dir=str(root / name), checkpoint_id=name, checkpoints_dir=str(root / "checkpoints"),
                     evidence_dir=str(root / name / "evidence"), result_path=str(root / name / "result.json"), **kw)


def _train(spec: TrainSpec, root) -> tuple[dict, object]:
    meta = jobs.train(spec, root / spec.checkpoint_id)
    return meta, root / "checkpoints" / spec.checkpoint_id


def _rollouts(ckpt_root):
    return read_rollouts(ckpt_root / "evidence").to_pandas().sort_values(["step", "group_id", "sample_idx"])[COLS]


@pytest.mark.slow
def test_a_line_trained_in_jobs_is_the_line_trained_at_once(tiny_policy, tmp_path):
    whole_meta, whole = _train(_job(tmp_path, "whole", tiny_policy, 4), tmp_path)
    first_meta, first = _train(_job(tmp_path, "first", tiny_policy, 2, horizon=4, keep_state=True), tmp_path)
    assert (first / "state" / "trainer_state.json").is_file() and first_meta["global_step"] == 2
    cont = jobs.continuation(first, HARNESS)
    assert cont == {"resume_state": str(first / "state"), "fresh_optimizer": False}
    second_meta, second = _train(_job(tmp_path, "second", first, 2, horizon=4, **cont), tmp_path)
    assert (second_meta["steps"], second_meta["global_step"]) == (2, 4)  # a job's own steps: line_steps sums them

    a, b = load_file(str(whole / "model.safetensors")), load_file(str(second / "model.safetensors"))
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    pieces = _rollouts(tmp_path / "first").merge(_rollouts(tmp_path / "second"), how="outer")
    assert sorted(pieces["step"].unique()) == [1, 2, 3, 4]
    assert _rollouts(tmp_path / "whole").reset_index(drop=True).equals(
        pieces.sort_values(["step", "group_id", "sample_idx"]).reset_index(drop=True))

    # a replicate from the same state: the same data, other samples (a short run's seed 1)
    rep_meta, rep = _train(_job(tmp_path, "replicate", first, 2, horizon=4, reseed=1, **cont), tmp_path)
    again = _rollouts(tmp_path / "replicate")
    assert list(again["prompt_id"]) == list(_rollouts(tmp_path / "second")["prompt_id"])
    assert list(again["completion"]) != list(_rollouts(tmp_path / "second")["completion"])

    # a harness with another learning rate cannot continue the optimizer's state: it starts it anew, and says so
    faster = tmp_path / "faster"
    shutil.copytree(HARNESS, faster)
    text = (faster / "harness.yaml").read_text()
    (faster / "harness.yaml").write_text(text.replace("learning_rate:", "learning_rate: 3.0e-4 #", 1))
    moved = jobs.continuation(first, faster)
    assert moved["fresh_optimizer"] is True
    meta, _ = _train(_job(tmp_path, "faster-job", first, 2, horizon=4, harness=faster, **moved), tmp_path)
    assert meta["fresh_optimizer"] and meta["optimizer"]["learning_rate"] == 3.0e-4
    assert json.loads((second / "meta.json").read_text())["continued"] == str(first / "state")


def test_a_job_past_the_lines_horizon_is_refused(tiny_policy, tmp_path):
    with pytest.raises(UserError, match="past its line.s horizon of 4 steps"):
        jobs.train(_job(tmp_path, "too-long", tiny_policy, 5, horizon=4), tmp_path / "too-long")
