"""Code domain through the real training path (a tiny policy): evidence carries the sealed execution columns, the
template's visible-tests reward agrees with the sealed visible pass, the hidden tests never reach the harness, a
planted crash-paying reward is caught by replay, and `evotrainer eval` grades HumanEval completion files."""

from __future__ import annotations

import json

import pytest

from evotrainer.trainer import jobs
from evotrainer.trainer.backtest import backtest
from evotrainer.trainer.domains import get_domain
from evotrainer.trainer.evidence import read_rollouts
from evotrainer.trainer.grpo import TrainSpec
from evotrainer.workspaces.run import RunWorkspace

from .conftest import TINY_MODEL, TINY_WARMUP, last_json, run_cli

CRASH_PASS = ("        if o.status != \"ok\":  # a syntax error, timeout, memory error or refused operation: no "
              "example passes\n            out.append(0.0)",
              "        if o.status != \"ok\":  # a syntax error, timeout, memory error or refused operation: no "
              "example passes\n            out.append(1.0)")


@pytest.fixture(scope="module")
def code_run(cache_dir, tmp_path_factory) -> RunWorkspace:
    from evotrainer.trainer.policy import ModelConfig, WarmupConfig

    work = tmp_path_factory.mktemp("code-warm")
    policy = jobs.warm_policy("code", 0, work, model_cfg=ModelConfig(**TINY_MODEL),
                              warm_cfg=WarmupConfig(**{**TINY_WARMUP, "max_steps": 300, "eval_every": 300}))
    ws = RunWorkspace.create(tmp_path_factory.mktemp("code") / "run", "code")
    ws.set_champion(policy, 0)
    out = ws.path / "checkpoints" / "gen0"
    spec = TrainSpec(domain="code", checkpoint=str(policy), harness_dir=str(ws.path / "harness"), steps=2, seed=0,
                     out_dir=str(out), checkpoint_id="gen0", checkpoints_dir=str(ws.path / "checkpoints"),
                     evidence_dir=str(ws.path / "evidence"), run=ws.path.name, generation=0, branch="main",
                     harness_commit=ws.harness.head(), result_path=str(out / "result.json"))
    jobs.train(spec, ws.path)
    return ws


@pytest.mark.slow
def test_evidence_carries_execution_columns_graded_on_hidden_tests(code_run):
    rows = read_rollouts(code_run.path / "evidence", 0, "main").to_pandas()
    assert len(rows) == 2 * 256
    assert set(rows.exec_status) <= {"ok", "syntax_error", "runtime_error", "timeout", "memory", "forbidden",
                                     "early_exit", "crash"}
    assert rows.correct.tolist() == (rows.hidden_pass == 1.0).tolist()
    assert not (~rows.formatted & (rows.exec_status != "syntax_error")).any()
    # the harness's reward sees only the visible examples, and on one-line expressions it agrees with the sealed
    # visible pass (the sealed format gate refuses multi-line bodies the harness may still run)
    formatted = rows[rows.formatted]
    assert len(formatted) > 20 and (abs(formatted.reward_visible_tests - formatted.visible_pass) < 1e-6).all()
    tasks = [json.loads(t) for t in rows.task]
    assert all("answer" not in t and "visible" in t for t in tasks)
    # the sealed grade is recomputed identically from the domain's own tasks, whatever the rows say
    code = get_domain("code")
    by_id = {t.id: t for t in code.tasks("train", 1000, seed=0)}
    sample = rows.head(64)
    regraded = code.grade(sample.completion.tolist(), [by_id[p].answer for p in sample.prompt_id],
                          ["expr"] * len(sample))
    assert [g.correct for g in regraded] == sample.correct.tolist()


@pytest.mark.slow
def test_replay_pays_crashing_programs_under_the_planted_bug(code_run):
    repo = code_run.harness
    branch, tree = repo.create_candidate(1, "crash pass", code_run.path / "worktrees")
    text = (tree / "rewards.py").read_text()
    assert CRASH_PASS[0] in text
    repo.write_files(tree, {"rewards.py": text.replace(*CRASH_PASS)})
    repo.commit(tree, "count a raising example as passed", intervention_id="crash-pass", hypothesis="planted",
                factor="reward", generation=1)
    res = backtest(code_run.path, branch, replay_only=True)
    rows = read_rollouts(code_run.path / "evidence", 0, "main").to_pandas()
    failing = rows[rows.exec_status != "ok"]
    assert len(failing) > 0, "the tiny policy wrote no failing program: nothing for the bug to pay"
    assert res.replay.reward_after.mean > res.replay.reward_before.mean
    assert res.replay.agreement_after.rewarded_incorrect > res.replay.agreement_before.rewarded_incorrect


def test_eval_grades_humaneval_completion_files(tmp_path):
    he = get_domain("code").tasks("humaneval")
    good, bad = tmp_path / "canonical.jsonl", tmp_path / "wrong.jsonl"
    good.write_text("".join(json.dumps({"task_id": t.id, "completion": t.target}) + "\n" for t in he))
    bad.write_text("".join(json.dumps({"task_id": t.id, "completion": "    return 0\n"}) + "\n" for t in he))
    res = last_json(run_cli("eval", "--domain", "code", "--split", "humaneval", "--completions", str(good),
                            "--json").stdout)
    assert res["n_tasks"] == 164 and res["accuracy"] == 1.0 and res["statuses"] == {"ok": 164}
    res = last_json(run_cli("eval", "--domain", "code", "--split", "humaneval", "--completions", str(bad),
                            "--json").stdout)
    assert res["accuracy"] == 0.0
    (tmp_path / "broken.jsonl").write_text('{"task_id": "HumanEval/9999", "completion": "x"}\n')
    proc = run_cli("eval", "--domain", "code", "--split", "humaneval", "--completions", str(tmp_path / "broken.jsonl"))
    assert proc.returncode == 2 and "broken.jsonl:1" in proc.stderr and "HumanEval/9999" in proc.stderr
    proc = run_cli("eval", "--domain", "code", "--split", "nope", "--completions", str(good))
    assert proc.returncode == 2 and "humaneval" in proc.stderr

