"""One training line continued across jobs (#24): a line trained in pieces equals the same line trained in one job
(same tensors, same rollouts); a replicate of a kept state samples anew; a changed optimizer setting restarts the
optimizer and says so."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file

from evotrainer.agents.offline.policy import OfflinePolicy
from evotrainer.agents.schemas import Plan, PlanInput
from evotrainer.base.config import loop_config
from evotrainer.base.errors import UserError
from evotrainer.graph.build import drive
from evotrainer.graph.events import EventLog
from evotrainer.trainer import jobs
from evotrainer.trainer.evidence import read_rollouts
from evotrainer.trainer.grpo import TrainSpec
from evotrainer.workspaces import TEMPLATES
from evotrainer.workspaces.run import RunWorkspace

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


def test_a_job_past_the_lines_horizon_is_refused(tmp_path):
    """Refused before any child starts (the policy is never read)."""
    with pytest.raises(UserError, match="past its line.s horizon of 4 steps"):
        jobs.train(_job(tmp_path, "too-long", tmp_path / "no-policy", 5, horizon=4), tmp_path / "too-long")


class ProposesNothing(OfflinePolicy):
    def plan(self, inp: PlanInput) -> Plan:
        return Plan(interventions=[], rationale="a plan that proposes nothing", author="test")


def _loop_run(root, policy, meta, **loop) -> RunWorkspace:
    cfg = loop_config("math", {"train_steps": 2, "backtest": {"steps": 2, "seeds": 1, "max_seeds": 1,
                                                              "dev_items": 20}, **loop})
    ws = RunWorkspace.create(root / "run", "math", checkpoint=str(policy), skills=str(root / "skills"),
                             budget={"generations": 2, "candidates": 1}, loop=cfg)
    summary = drive(ws, meta, fresh=True)
    assert summary.finished and summary.promoted == []
    return ws


def _reference(root, policy, ws: RunWorkspace):
    """The template harness never evolved: the same policy, seed and line horizon, the main line's steps at once."""
    cfg = ws.config()
    spec = _job(root, "reference", policy, 4, horizon=cfg.loop.horizon(cfg.budget.generations))
    spec = spec.model_copy(update={"seed": cfg.seed})
    return _train(spec, root)[1]


def _same_tensors(a_dir, b_dir) -> bool:
    a, b = load_file(str(a_dir / "model.safetensors")), load_file(str(b_dir / "model.safetensors"))
    return a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


@pytest.mark.slow
def test_with_nothing_proposed_the_main_line_is_the_reference(tiny_policy, tmp_path):
    ws = _loop_run(tmp_path, tiny_policy, ProposesNothing())
    champion = ws.champion_checkpoint()
    assert json.loads((champion / "meta.json").read_text())["global_step"] == 4
    assert _same_tensors(champion, _reference(tmp_path, tiny_policy, ws))


@pytest.mark.slow
def test_the_control_arm_that_is_the_next_segment_is_adopted_not_trained_again(tiny_policy, tmp_path):
    """With a candidate backtested and nothing promoted (no interval clears 1.0), generation 2's segment is the
    control arm of seed 0 that generation 1 trained: adopted with its evidence, and still the reference's line."""
    ws = _loop_run(tmp_path, tiny_policy, OfflinePolicy(), promotion={"min_ci_low": 1.0})
    adopted = [e for e in EventLog(ws.path / "events.jsonl").read() if e.get("adopted")]
    assert [e["generation"] for e in adopted] == [2]
    assert not (ws.path / "checkpoints" / "g2-train" / "checkpoints" / "policy").exists()
    main = read_rollouts(ws.path / "evidence", 1, "main").to_pandas()
    assert len(main) and set(main["branch"]) == {"main"} and sorted(main["step"].unique()) == [3, 4]
    assert _same_tensors(ws.champion_checkpoint(), _reference(tmp_path, tiny_policy, ws))
