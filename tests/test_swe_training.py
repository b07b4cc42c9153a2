"""SWE domain through the real training path (a tiny policy): multi-turn episodes via TRL's rollout_func, the
evidence's episode columns graded by the sealed replay, observations masked, the harness's env.py in force for
training and ignored by sealed evaluation, and a replay backtest of the leak-closing candidate."""

from __future__ import annotations

import json

import pytest

from evotrainer.trainer import jobs
from evotrainer.trainer.backtest import backtest
from evotrainer.trainer.domains import get_domain
from evotrainer.trainer.evidence import read_rollouts
from evotrainer.trainer.grpo import TrainSpec
from evotrainer.workspaces.run import RunWorkspace

from .conftest import last_json, run_cli

pytestmark = pytest.mark.slow  # every test needs the warmed SWE policy
TINY_SWE = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64, "max_positions": 512}


@pytest.fixture(scope="module")
def swe_policy(cache_dir, tmp_path_factory):
    from evotrainer.trainer.policy import ModelConfig, WarmupConfig

    return jobs.warm_policy("swe", 0, tmp_path_factory.mktemp("swe-warm"), model_cfg=ModelConfig(**TINY_SWE),
                            warm_cfg=WarmupConfig(target_accuracy=0.99, max_steps=60, batch_size=32, eval_every=60,
                                                  eval_items=16, target_noise=0.3))


def train(ws: RunWorkspace, policy, branch_dir, generation: int, steps: int = 2) -> None:
    out = ws.path / "checkpoints" / f"gen{generation}"
    spec = TrainSpec(domain="swe", checkpoint=str(policy), harness_dir=str(branch_dir), steps=steps, seed=0,
                     out_dir=str(out), checkpoint_id=f"gen{generation}", checkpoints_dir=str(ws.path / "checkpoints"),
                     evidence_dir=str(ws.path / "evidence"), run=ws.path.name, generation=generation, branch="main",
                     harness_commit=ws.harness.head(), result_path=str(out / "result.json"))
    jobs.train(spec, ws.path)


@pytest.fixture(scope="module")
def swe_run(swe_policy, tmp_path_factory) -> RunWorkspace:
    ws = RunWorkspace.create(tmp_path_factory.mktemp("swe") / "run", "swe")
    ws.set_champion(swe_policy, 0)
    train(ws, swe_policy, ws.path / "harness", 0)
    return ws


def test_episodes_are_rollouts_with_sealed_episode_columns(swe_run):
    rows = read_rollouts(swe_run.path / "evidence", 0, "main").to_pandas()
    assert len(rows) == 2 * 32  # two steps of 4 issues x 8 episodes
    for col in ("turns", "tool_calls", "tool_errors", "actions", "edits", "submitted", "end", "tested_after_edit",
                "leak_calls", "transcript"):
        assert col in rows.columns
    assert set(rows.end) <= {"submit", "turn_limit", "context"}
    assert (rows.turns >= 1).all() and (rows.turns <= 8).all()
    assert (rows.truncated == ~rows.submitted).all()  # an unsubmitted episode does not end with <eos>
    assert rows.mean_logprob.notna().all()  # the loss saw the policy's own tokens of every episode
    # the hidden tests never reach the harness; the episode column (how it ended, visible tests) does
    tasks = [json.loads(t) for t in rows.task]
    assert all("answer" not in t and "episode" in t for t in tasks)
    # the template's reward agrees with what its episode column says
    for t, reward in zip(tasks, rows.reward_visible_tests_pass):
        e = json.loads(t["episode"])
        assert reward == float(e["submitted"] and e["visible_passed"] == e["visible_total"])
    # the sealed grade is recomputed identically from the domain's own tasks
    swe = get_domain("swe")
    by_id = {t.id: t for t in swe.tasks("train", 1000, seed=0)}
    sample = rows.head(32)
    regraded = swe.grade(sample.completion.tolist(), [by_id[p].answer for p in sample.prompt_id],
                         ["episode"] * len(sample))
    assert [g.correct for g in regraded] == sample.correct.tolist()
    assert [g.columns["turns"] for g in regraded] == sample.turns.tolist()


def test_training_follows_env_py_and_sealed_evaluation_does_not(swe_run, swe_policy, tmp_path):
    repo = swe_run.harness
    branch, tree = repo.create_candidate(1, "no tools but submit", swe_run.path / "worktrees")
    env = (tree / "env.py").read_text()
    repo.write_files(tree, {"env.py": env.replace('TOOLS = ["search", "view", "edit", "test", "submit", "history"]',
                                                  'TOOLS = ["submit"]').replace("MAX_TURNS = 8", "MAX_TURNS = 3")})
    repo.commit(tree, "only submit", intervention_id="only-submit", hypothesis="test", factor="env", generation=1)
    train(swe_run, swe_policy, tree, 1, steps=1)
    rows = read_rollouts(swe_run.path / "evidence", 1, "main").to_pandas()
    acts = [a for x in rows.actions for a in json.loads(x)]
    assert (rows.turns <= 3).all()
    assert all(a[2] for a in acts if a[0] != "submit")  # every other tool is refused in training
    # sealed evaluation of the same policy uses the domain's environment: view/edit/test work there
    ev = jobs.evaluate(swe_policy, "swe", "dev", tmp_path, k=1, limit=16, seed=0)
    assert ev.n_items == 16 and 0.0 <= ev.accuracy <= 1.0


def test_replay_backtest_of_the_leak_closing_candidate(swe_run):
    from evotrainer.agents.offline.catalog import apply
    from evotrainer.trainer.diagnostics import Finding

    repo = swe_run.harness
    branch, tree = repo.create_candidate(2, "close the leak", swe_run.path / "worktrees")
    files = {p: (tree / p).read_text() for p in ("env.py", "harness.yaml")}
    leak = Finding(analyzer="leak_usage", metric="leak_usage_ratio", value=0.5, severity="critical", gate=True,
                   message="crafted")
    change = apply("close_leak", files, [leak])
    assert change is not None and '"history"' not in change.files["env.py"].split("TOOLS = ")[1].split("\n")[0]
    repo.write_files(tree, change.files)
    repo.commit(tree, change.change, intervention_id="close-leak", hypothesis=change.hypothesis, factor="env.tools",
                generation=2)
    res = backtest(swe_run.path, branch, replay_only=True)
    assert res.replay is not None and res.replay.n_rollouts > 0
    # the rewards did not change: the replayed reward distribution is the stored one
    assert abs(res.replay.reward_after.mean - res.replay.reward_before.mean) < 1e-6


def test_eval_cli_runs_sealed_episodes(swe_policy, tmp_path):
    proc = run_cli("eval", "--checkpoint", str(swe_policy), "--domain", "swe", "--limit", "8", "--k", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    res = last_json(proc.stdout)
    assert res["n_items"] == 8 and res["split"] == "dev"
