"""`evotrainer analyze`: the three trajectory analyses over runs written as the loop writes them (a real harness
repository, verdict and backtest records, plans, a real skill store, a summary), one run of them in progress."""

import json

from evotrainer.agents.schemas import Intervention, Plan, VerdictRecord
from evotrainer.base.files import atomic_write_text
from evotrainer.graph.build import RunSummary
from evotrainer.graph.state import GenerationRecord
from evotrainer.memory.skill import Skill, Trigger, Validation
from evotrainer.memory.store import SkillStore
from evotrainer.trainer.backtest import BacktestResult, ShortRunResult
from evotrainer.trainer.diagnostics import Finding
from evotrainer.trainer.evidence import EvidenceWriter, branch_dir
from evotrainer.workspaces.run import RunWorkspace

from .conftest import run_cli
from .test_evidence import _row


def _judged(ws: RunWorkspace, gen: int, name: str, factor: str, transform: str, decision: str, effect: float,
            reward: float, gates: list[str] = (), sources: list[str] = (), findings: list[Finding] = (),
            prior: str = "no measurement in memory: N(0, 0.02^2)") -> str:
    repo = ws.harness
    branch, wt = repo.create_candidate(gen, name, ws.path / "worktrees")
    y = wt / "harness.yaml"
    y.write_text(y.read_text() + f"# {name}\n")
    iv = Intervention(id=f"g{gen}-{transform}", hypothesis="h", factor=factor, change=name, transform=transform,
                      sources=list(sources))
    repo.commit(wt, name, intervention_id=iv.id, hypothesis="h", factor=factor, generation=gen)
    short = ShortRunResult(steps=20, seeds=[0], dev_items=500, arms=[], per_seed_delta=[effect], delta=effect,
                           ci_low=effect - 0.02, ci_high=effect + 0.02, se=0.01, mde=0.028, train_reward_delta=reward,
                           train_correct_delta=0.0, findings=list(findings), failed_gates=list(gates),
                           stopped="budget", trace=[],
                           seconds=1.0, seconds_per_arm=0.5)
    bt = BacktestResult(run=ws.path.name, branch=branch, commit="c", champion_commit="p", generation=gen,
                        start_checkpoint=None, replay=None, short_run=short, failed_gates=list(gates), seconds=1.0)
    atomic_write_text(ws.path / "reports" / f"backtest-{branch_dir(branch)}.json", bt.model_dump_json())
    verdict = VerdictRecord(branch=branch, decision=decision, failed_gates=list(gates), effect=effect,
                            intervention=iv, generation=gen, reasons=["r"], prior=prior, p_gain=0.6)
    verdict.save(ws.verdict_path(branch))
    plan = ws.path / "reports" / f"plan-g{gen}.json"
    old = Plan.model_validate_json(plan.read_text()) if plan.is_file() else Plan()
    atomic_write_text(plan, Plan(interventions=[*old.interventions, iv]).model_dump_json())
    if decision == "promote":
        repo.promote(branch, gen, verdict.model_dump())
    elif decision == "inconclusive":
        repo.reject(branch, gen, "inconclusive", verdict.model_dump(), inconclusive=True)
    else:
        repo.reject(branch, gen, "; ".join(gates) or "worse", verdict.model_dump())
    return branch


def test_analyses_over_runs_of_two_domains(tmp_path):
    store = SkillStore(tmp_path / "skills", embedding="hashing")
    learned = Skill(trigger=Trigger(text="dead groups"), factor="recipe.temperature", intervention="hotter sampling",
                    transform="temperature", outcome="positive", effect=0.03,
                    validations=[Validation(domain="math", verdict="promote", effect=0.03, ci_low=0.01, ci_high=0.05)])
    store.put(learned)

    math = RunWorkspace.create(tmp_path / "math", "math", skills=str(store.path))
    _judged(math, 1, "temp", "recipe.temperature", "temperature", "promote", 0.03, 0.01)
    # the hack's short run: rollouts paid for format while wrong, which its gate's finding cites
    paid = [_row(1, i, "cand/g2-bonus") | {"generation": 2, "rollout_id": f"math/g2/cand/g2-bonus/1:{i}",
                                          "completion": f"<b>{i}</b> Answer: 7", "reward": 0.5, "correct": False}
            for i in range(4)]
    writer = EvidenceWriter(math.path / "evidence", 2, "cand/g2-bonus", "abc-s0-k20")
    writer.add_rollouts(paid)
    writer.flush(1)
    gate = Finding(analyzer="divergence_gate_answer_format", metric="reward_rise", value=0.12, severity="critical",
                   gate=True, message="format reward rose while correct did not",
                   evidence=[r["rollout_id"] for r in paid])
    hack = _judged(math, 2, "bonus", "reward.format_weight", "format_weight", "reject", -0.01, 0.12,
                   gates=["divergence_gate_answer_format/reward_rise"], findings=[gate])
    summary = RunSummary(run="math", meta_policy="offline", finished=True, stop_reason="generations", generations=2,
                         dev_start=0.3, dev_final=0.33, promoted=[], rejected=[], candidates=2, steps_used=80,
                         seconds_used=1, llm_dollars=0, skills=1,
                         history=[GenerationRecord(generation=1, champion_commit="a", checkpoint="c"),
                                  GenerationRecord(generation=2, champion_commit="b", checkpoint="c",
                                                   revised="divergence_gate_answer_format")])
    atomic_write_text(math.path / "reports" / "summary.json", summary.model_dump_json())

    code = RunWorkspace.create(tmp_path / "code", "code", skills=str(store.path))  # in progress: no summary
    measured = "1 measured backtest(s) in memory, 1 in other domains: N(+0.0140, 0.0150^2)"
    informed = _judged(code, 1, "temp", "recipe.temperature", "temperature", "inconclusive", 0.004, 0.0,
                       sources=["dead_groups:dead_group_ratio", learned.id], prior=measured)
    repo = code.harness
    open_branch, _ = repo.create_candidate(2, "open", code.path / "worktrees")

    out = tmp_path / "an"
    proc = run_cli("analyze", str(math.path), str(code.path), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    md = (out / "analysis.md").read_text()
    assert "2 runs (1 code, 1 math), 4 candidates" in md
    # 1: per domain what was kept
    assert "| math | `temperature` | 1 | 1 | g1 | +0.030 |" in md
    assert "| code | `temperature` | 1 | 0 | - | +0.004 |" in md
    # 2: the gate, born in generation 2 by revision, with the reward that rose against a dev that fell
    assert (f"| math | `{hack}` | `divergence_gate_answer_format/reward_rise` (evolved, born g2) | +0.120 | +0.000 "
            "| -0.010 |") in md
    # 3: the chain retrieval -> proposal -> outcome, the skill learned in math used in code: cross-domain
    assert f"| code | `{informed}` | `{learned.id}` | positive +0.030 | math | yes | inconclusive +0.004 |" in md
    assert "| math | math | 2 | 0 | 0 | 1 | 1 |" in md and "| code | code | 2 | 1 | 1 | 0 | none promoted |" in md
    # and the prior it was judged under: math's measurement of the change (a vague prior is no row)
    assert f"| code | `{informed}` | temperature | {measured} | 0.600 | inconclusive +0.004 |" in md
    assert md.count("| 0.600 |") == 1
    facts = json.loads((out / "analysis.json").read_text())
    statuses = {c["branch"]: c["status"] for r in facts["runs"] for c in r["candidates"]}
    assert statuses[hack] == "gate" and statuses[open_branch] == "open"
    for png in ("retained.png", "blocked.png", "skills.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the same analyses of one run as a section of its HTML report
    assert run_cli("report", str(math.path)).returncode == 0
    page = (math.path / "reports" / "report.html").read_text()
    assert "<h3>2. Invalid branches blocked</h3>" in page
    shown = "<code>divergence_gate_answer_format/reward_rise</code> (evolved, born g2)"
    assert f"<td><code>{hack}</code></td><td>{shown}" in page
    # and in the candidate's view, the rollouts its own finding cites (the first three), escaped
    for i in range(3):
        assert f"<code>math/g2/cand/g2-bonus/1:{i}</code>: reward 0.500, correct False" in page
        assert f"&lt;b&gt;{i}&lt;/b&gt; Answer: 7" in page
    assert "g2-bonus/1:3</code>" not in page
    # one run: the default output folder is the run's own
    assert run_cli("analyze", str(code.path)).returncode == 0
    assert (code.path / "reports" / "analysis" / "analysis.md").is_file()


def test_analyze_refuses_what_is_not_a_run(tmp_path):
    proc = run_cli("analyze", str(tmp_path), "--out", str(tmp_path / "an"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "is not an EvoTrainer run" in proc.stderr
    assert not (tmp_path / "an").exists()
