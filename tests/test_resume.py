"""A training child killed mid-run and started again continues exactly: same weights, same evidence."""

import os
import signal
import subprocess
import sys
import time

import pytest
from safetensors.torch import load_file

from evotrainer.trainer import jobs
from evotrainer.trainer.evidence import read_rollouts, read_steps
from evotrainer.trainer.grpo import TrainSpec
from evotrainer.trainer.harness import load_spec
from evotrainer.trainer.sandbox import child_env
from evotrainer.workspaces import TEMPLATES

STEPS = 6


def _spec(tiny_policy, root) -> TrainSpec:
    return TrainSpec(domain="math", checkpoint=str(tiny_policy), harness_dir=str(TEMPLATES / "math"), steps=STEPS,
                     seed=1, out_dir=str(root), checkpoint_id="ck", checkpoints_dir=str(root / "checkpoints"),
                     evidence_dir=str(root / "evidence"), save_every=2, result_path=str(root / "result.json"))


@pytest.mark.slow
def test_killed_training_resumes_exactly(tiny_policy, tmp_path):
    ref = _spec(tiny_policy, tmp_path / "ref")
    jobs.train(ref, tmp_path / "ref")

    spec = _spec(tiny_policy, tmp_path / "killed")
    spec_path = jobs.prepare_training(spec, tmp_path / "killed").spec_path
    proc = subprocess.Popen([sys.executable, "-m", "evotrainer.trainer.grpo", str(spec_path)], cwd=spec.harness_dir,
                            env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    trl = tmp_path / "killed" / "child" / "trl"
    deadline = time.time() + 300
    while not any((trl / f"checkpoint-{s}" / "trainer_state.json").exists() for s in (2, 4)):
        assert proc.poll() is None and time.time() < deadline, "training ended before it could be killed"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "killed" / "checkpoints" / "ck").exists()

    meta = jobs.train(spec, tmp_path / "killed")  # the same spec again: resumes from the last checkpoint
    assert meta["resumed_from"] is not None and meta["steps"] == STEPS

    a = load_file(str(tmp_path / "ref" / "checkpoints" / "ck" / "model.safetensors"))
    b = load_file(str(tmp_path / "killed" / "checkpoints" / "ck" / "model.safetensors"))
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    cols = ["step", "group_id", "sample_idx", "prompt_id", "completion", "reward", "advantage", "correct"]
    ra = read_rollouts(tmp_path / "ref" / "evidence").to_pandas().sort_values("rollout_id")[cols]
    rb = read_rollouts(tmp_path / "killed" / "evidence").to_pandas().sort_values("rollout_id")[cols]
    assert len(ra) == STEPS * load_spec(TEMPLATES / "math").trainer["per_device_train_batch_size"]
    assert ra.reset_index(drop=True).equals(rb.reset_index(drop=True))
    assert read_steps(tmp_path / "killed" / "evidence").column("step").to_pylist() == list(range(1, STEPS + 1))
