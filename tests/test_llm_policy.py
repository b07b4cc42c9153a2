"""`LLMPolicy` inside the loop's nodes, against a real local HTTP server speaking the OpenAI API with scripted replies
(the requests it received are what the assertions read): the Coder and the Critic are sent the findings, the
diagnosis and both arms' health; a catalog pick is committed exactly as `catalog.apply` writes it and no Coder is
asked for it; both policies drop the same interventions (one filter); an analyzer the LLM writes for diagnostics
revision is validated on history before it is committed, and refused when it flags a promoted branch."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from evotrainer.agents.coder import harness_files
from evotrainer.agents.llm import LLMClient
from evotrainer.agents.llm_policy import LLMPolicy
from evotrainer.agents.meta_policy import MetaPolicy
from evotrainer.agents.offline.catalog import CATALOG, apply
from evotrainer.agents.offline.policy import OfflinePolicy
from evotrainer.agents.schemas import Diagnosis, Intervention, PlanInput, Verdict
from evotrainer.graph.events import EventLog
from evotrainer.graph.nodes import Loop
from evotrainer.graph.state import CandidateState, LoopState
from evotrainer.memory.skill import Skill, Trigger
from evotrainer.memory.store import Hit, SkillStore
from evotrainer.trainer.backtest import Agreement, Arm, BacktestResult, Distribution, ReplayResult, ShortRunResult
from evotrainer.trainer.diagnostics import Finding
from evotrainer.trainer.evidence import EvidenceWriter
from evotrainer.workspaces.run import RunWorkspace

from .conftest import chat_completion, local_server, send_json

MODEL = "openai/scripted-policy"
AGENTS = ("diagnoser", "planner", "coder", "critic")
FINDINGS = [Finding(analyzer="dead_groups", metric="dead_group_ratio", value=0.61, threshold=0.5, severity="critical",
                    message="61% of groups have zero reward variance", evidence=["r/1:0:0"]),
            Finding(analyzer="truncation", metric="truncated_ratio", value=0.07, severity="info",
                    message="7% of completions truncated (champion line)")]
DIAGNOSIS = Diagnosis(generation=1, summary="groups are dead: the sampler gives them no variance (scripted diagnosis)")
FREE = Intervention(id="x", hypothesis="If we sample hotter, fewer groups are dead", factor="recipe.temperature",
                    change="raise the temperature 1.0 -> 1.3", target_files=["harness.yaml"],
                    sources=["dead_groups:dead_group_ratio"])
EDIT = {"message": "temperature 1.3", "edits": [{"path": "harness.yaml", "search": "  temperature: 1.0 ",
                                                  "replace": "  temperature: 1.3 "}]}


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local-test")


@contextmanager
def scripted(script: dict[str, list]) -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """An OpenAI chat endpoint answering each agent (told apart by its system prompt) with the next reply of its
    script (the last one repeats); yields its base URL and the (agent, user message) pairs it received."""
    seen: list[tuple[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            system = next((m["content"] for m in body["messages"] if m["role"] == "system"), "")
            agent = next((a for a in AGENTS if f"You are the {a.title()}" in system), "preflight")
            user = "\n".join(m["content"] for m in body["messages"] if m["role"] == "user")
            replies = script.get(agent) or ["OK"]
            reply = replies[min(sum(a == agent for a, _ in seen), len(replies) - 1)]
            seen.append((agent, user))
            send_json(self, chat_completion(reply if isinstance(reply, str) else json.dumps(reply)))

    with local_server(Handler) as url:
        yield url, seen


def _loop(tmp_path: Path, url: str) -> tuple[Loop, RunWorkspace, list[dict]]:
    ws = RunWorkspace.create(tmp_path / "run", "math")
    policy, events = LLMPolicy(LLMClient(MODEL, url, timeout_s=30, retries=1)), EventLog(ws.path / "events.jsonl")
    policy.attach(ws.path, lambda agent, record: events.emit(record.pop("kind", "call"), **record))
    assert isinstance(policy, MetaPolicy) and isinstance(OfflinePolicy(), MetaPolicy)
    return Loop(ws, policy, SkillStore(tmp_path / "skills", "hashing"), events), ws, events.read()


def _git(ws: RunWorkspace, *args: str) -> str:
    return subprocess.run(["git", "-C", str(ws.path / "harness"), *args], capture_output=True, text=True,
                          check=True).stdout


def _backtest(branch: str) -> BacktestResult:
    d, a = Distribution.of([0.0, 1.0]), Agreement(corr=0.5, auc=0.8, rewarded_incorrect=0.0)
    mine = Finding(analyzer="format_failures", metric="format_failure_ratio", value=0.33, severity="warning",
                   message="33% unreadable answers in the candidate's own arms", evidence=["r/2:1:1"])
    replay = ReplayResult(harness="h", n_rollouts=10, n_groups=2, generations=[0], branches=["main"],
                          reward_before=d, reward_after=d, components_before={}, components_after={},
                          agreement_before=a, agreement_after=a, changed_fraction=0.2, dead_groups_before=1,
                          dead_groups_after=0, dead_ratio_before=0.5, dead_ratio_after=0.0, groups_rescued=1,
                          groups_deadened=0, groups_dropped=0, dead_groups_dropped=0, failed_gates=[], seconds=0.1,
                          findings=[mine.model_copy(update={"message": "replay: 25% unreadable under its rewards"})])
    arms = [Arm(role=role, seed=0, commit="c" * 40, checkpoint="ck", dev_accuracy=dev, train_reward=0.5,
                train_correct=0.4, seconds=1.0) for role, dev in (("control", 0.4123), ("candidate", 0.4567))]
    short = ShortRunResult(steps=10, seeds=[0], dev_items=500, arms=arms, per_seed_delta=[0.0444], delta=0.0444,
                           ci_low=-0.02, ci_high=0.1, se=0.03, mde=0.08, train_reward_delta=0.1,
                           train_correct_delta=0.01, findings=[mine], failed_gates=[],
                           control_gates=["leak_usage"], stopped="budget", trace=[], seconds=1, seconds_per_arm=1)
    return BacktestResult(run="r", branch=branch, commit="c" * 40, champion_commit="d" * 40, generation=1,
                          start_checkpoint=None, replay=replay, short_run=short, failed_gates=[], seconds=1)


def test_the_coder_and_the_critic_are_sent_the_findings_and_both_arms_health(tmp_path):
    verdict = {"branch": "ignored", "decision": "reject", "reasons": ["the candidate's arms stop answering readably"],
               "lesson": "hotter sampling traded readability for variance"}
    with scripted({"coder": [EDIT], "critic": [verdict]}) as (url, seen):
        loop, ws, _ = _loop(tmp_path, url)
        state = LoopState(findings=FINDINGS, diagnosis=DIAGNOSIS, candidates=[CandidateState(intervention=FREE)])
        [cand] = loop.implement(state)["candidates"]
        assert cand.commit and not cand.error
        [coder] = [user for agent, user in seen if agent == "coder"]
        assert DIAGNOSIS.summary in coder
        assert all(f.message in coder and f'"metric": "{f.metric}"' in coder for f in FINDINGS)
        cand = cand.model_copy(update={"backtest": _backtest(cand.branch)})
        [judged] = loop.critique(state.model_copy(update={"candidates": [cand]}))["candidates"]
    [critic] = [user for agent, user in seen if agent == "critic"]
    bt = cand.backtest
    assert bt.short_run.findings[0].message in critic and bt.replay.findings[0].message in critic  # its own findings
    assert all(f.message in critic for f in FINDINGS)  # the champion line's health report
    assert "0.4123" in critic and "0.4567" in critic and "leak_usage" in critic  # both arms: dev per seed, gates
    assert judged.verdict.decision == "reject" and verdict["reasons"][0] in judged.verdict.reasons


def test_a_catalog_pick_is_applied_exactly_and_both_policies_filter_alike(tmp_path):
    files = harness_files(Path(RunWorkspace.create(tmp_path / "probe", "math").path / "harness"))
    pick = {"id": "p", "hypothesis": "", "factor": "recipe.anything", "change": "my own words",
            "target_files": ["rewards.py"], "transform": "temperature"}
    plan = {"rationale": "scripted", "interventions": [
        pick,
        {**pick, "transform": "close_leak", "factor": "env.tools"},  # does not apply to a math harness: dropped
        {**FREE.model_dump(), "transform": None},  # the factor the pick already changes: dropped
        {**FREE.model_dump(), "factor": "recipe.scale_rewards", "transform": "scale_rewards"},  # negative here
        {**FREE.model_dump(), "factor": "filters.group_filters", "transform": None},  # tried on this champion
        {**FREE.model_dump(), "factor": "reward.brevity", "change": "a free-form brevity term", "transform": None}]}
    negative = Hit(skill=Skill(trigger=Trigger(text="dead groups", analyzers=["dead_groups"]),
                               factor="recipe.scale_rewards", intervention="batch scaling",
                               transform="scale_rewards", outcome="negative"), score=0.2)
    inp = PlanInput(generation=1, domain="math", k=5, diagnosis=DIAGNOSIS, findings=FINDINGS, files=files,
                    skills=[negative], tried=["filters.group_filters"])
    with scripted({"planner": [plan]}) as (url, seen):
        out = LLMPolicy(LLMClient(MODEL, url, timeout_s=30, retries=1)).plan(inp)
    [user] = [u for a, u in seen if a == "planner"]
    assert '"temperature": {"factor": "recipe.temperature"' in user and "close_leak" not in user  # the catalog menu
    change = apply("temperature", files, FINDINGS)
    assert [(iv.transform, iv.factor) for iv in out.interventions] == \
        [("temperature", "recipe.temperature"), (None, "reward.brevity")]
    chosen = out.interventions[0]
    assert (chosen.id, chosen.change, chosen.target_files, chosen.hypothesis) == \
        ("g1-temperature", change.change, sorted(change.files), change.hypothesis)
    for why in ("close_leak dropped", "already changed by an earlier", "skill sk-", "already tried"):
        assert why in out.rationale
    # the offline Planner drops the same negative lesson under the same diagnosis, and the tried factor
    offline = [iv.transform for iv in OfflinePolicy().plan(inp.model_copy(update={"k": 30})).interventions]
    assert "temperature" in offline and "scale_rewards" not in offline and "drop_dead_groups" not in offline
    unfiltered = OfflinePolicy().plan(inp.model_copy(update={"k": 30, "skills": [], "tried": []})).interventions
    assert {"scale_rewards", "drop_dead_groups"} <= {iv.transform for iv in unfiltered}

    with scripted({}) as (url, seen):  # the pick committed, no Coder asked
        loop, ws, _ = _loop(tmp_path, url)
        state = LoopState(findings=FINDINGS, diagnosis=DIAGNOSIS, candidates=[CandidateState(intervention=chosen)])
        [cand] = loop.implement(state)["candidates"]
    assert cand.commit and cand.branch == "cand/g1-temperature" and not [a for a, _ in seen if a == "coder"]
    assert _git(ws, "diff", "--name-only", "main", cand.commit).split() == sorted(change.files)
    assert {p: _git(ws, "show", f"{cand.commit}:{p}") for p in change.files} == change.files
    assert "catalog transform temperature, planned by meta-LLM" in _git(ws, "log", "-1", "--format=%s", cand.commit)


def _rows(branch: str, brevity: float) -> list[dict]:
    """Rollouts of one judged branch: its `reward_brevity` level is what the scripted analyzer reads."""
    rows = []
    for step in (1, 2, 3):
        for i in range(8):
            ok = i % 2 == 0
            rows.append(dict(rollout_id=f"r/g1/{branch}/{step}:0:{i}", run="r", generation=1, branch=branch,
                             harness_commit="", checkpoint="policy", step=step, prompt_id=f"p{step}",
                             group_id=f"{step}:0", sample_idx=i, difficulty=1, prompt="1+1=", completion="2",
                             completion_ids=[50], task="{}", n_tokens=1, truncated=False, reward=float(ok) + brevity,
                             advantage=0.0, loss_masked=False, correct=ok, formatted=True, mean_logprob=-0.5,
                             reward_correctness=float(ok), reward_brevity=brevity))
    return rows


def _analyzer(level: float) -> dict:
    """The Coder's reply for diagnostics revision: one new analyzer flagging a brevity pay above `level`."""
    src = ("from evotrainer.trainer.diagnostics import Finding, analyzer\n\n\n"
           f"@analyzer(\"brevity_pay\", level={level})\n"
           "def brevity_pay(rollouts, steps, thresholds):\n"
           "    \"\"\"Brevity paid above `level` on average, whatever the sealed grade.\"\"\"\n"
           "    if \"reward_brevity\" not in rollouts:\n"
           "        return []\n"
           "    value = float(rollouts[\"reward_brevity\"].mean())\n"
           "    if value <= thresholds[\"level\"]:\n"
           "        return []\n"
           "    return [Finding(analyzer=\"brevity_pay\", metric=\"brevity_mean\", value=value,\n"
           "                    threshold=thresholds[\"level\"], severity=\"critical\", gate=True,\n"
           "                    message=\"brevity paid regardless of correctness\")]\n")
    return {"message": "gate brevity pay", "edits": [{"path": "diagnostics/brevity_pay.py", "search": None,
                                                       "replace": src}]}


@pytest.mark.parametrize("level", [0.5, 0.05], ids=["kept", "flags-the-promoted-branch"])
def test_an_llm_written_analyzer_is_validated_on_history_before_it_is_committed(tmp_path, level):
    """Two judged branches: a promoted one whose rollouts earn little brevity pay and a rejected one (the revision's
    trigger) that earns much. The Coder's first reply also edits rewards.py and is refused in the policy (a revision
    adds one analyzer, nothing else); its second is replayed over history in the sandbox and committed only when it
    flags the rejected branch and not the promoted one. Re-entered after that, the node asks for no other one."""
    bad = {"message": "x", "edits": [_analyzer(level)["edits"][0], {"path": "rewards.py", "search": None,
                                                                     "replace": "# emptied\n"}]}
    with scripted({"coder": [bad, _analyzer(level)]}) as (url, seen):
        loop, ws, _ = _loop(tmp_path, url)
        repo, files = ws.harness, harness_files(ws.path / "harness")
        judged = {}
        for tid, brevity in (("temperature", 0.1), ("loss_type", 0.9)):
            branch, tree = repo.create_candidate(1, tid, ws.path / "worktrees")
            change = apply(tid, files, [])
            repo.write_files(tree, change.files)
            repo.commit(tree, tid, intervention_id=f"g1-{tid}", hypothesis="h", factor=CATALOG[tid].factor,
                        generation=1, paths=list(change.files))
            w = EvidenceWriter(ws.path / "evidence", 1, branch)
            w.add_rollouts(_rows(branch, brevity))
            w.add_step({"step": 3, "reward": 0.5})
            w.flush(3)
            judged[tid] = branch
        repo.promote(judged["temperature"], 1, {"decision": "promote"})
        repo.reject(judged["loss_type"], 1, "train reward rose without dev", {"decision": "revise"})
        head = repo.head("main")
        iv = Intervention(id="g1-loss_type", hypothesis="h", factor=CATALOG["loss_type"].factor, change="loss")
        cand = CandidateState(intervention=iv, branch=judged["loss_type"],
                              verdict=Verdict(branch=judged["loss_type"], decision="revise"))
        state = LoopState(findings=FINDINGS, revise=[cand.branch], candidates=[cand])
        out = loop.revise_diagnostics(state)
        asked = len(seen)
        assert loop.revise_diagnostics(state) == out and len(seen) == asked  # re-entered: decided, no new analyzer
    coder = [user for agent, user in seen if agent == "coder"]
    assert len(coder) == 2 and "adds exactly one new file" in coder[1] and judged["loss_type"] in coder[0]
    report = json.loads((ws.path / "reports" / "revision-g1.json").read_text())
    flagged = {s["branch"]: s["flagged"] for s in report["slices"]}
    assert flagged[judged["loss_type"]] and report["analyzer"] == "brevity_pay"
    decision = [e for e in loop.events.read() if e.get("node") == "revise_diagnostics"][-1]
    if level == 0.5:
        assert out == {"revised": "brevity_pay"} and report["committed"] and report["false_alarms"] == 0
        assert _git(ws, "show", "main:diagnostics/brevity_pay.py") == _analyzer(level)["edits"][0]["replace"]
        assert "validated on history" in _git(ws, "log", "-1", "--format=%s", "main")
    else:  # it flags the promoted branch too: refused, the champion unchanged
        assert out == {"revised": None} and not report["committed"] and report["false_alarms"] == 1
        assert flagged[judged["temperature"]] and repo.head("main") == head
        assert not (ws.path / "harness" / "diagnostics" / "brevity_pay.py").exists()
    assert decision["committed"] == (level == 0.5)
