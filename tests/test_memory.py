"""Skill memory on a real persistent Chroma store: reopen in a fresh process, filters, retrieval quality,
export/import round trip, distillation merges, and one-line errors that leave the store untouched."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from evotrainer.agents.offline.policy import OfflinePolicy
from evotrainer.agents.schemas import (
    Bottleneck,
    DiagnoseInput,
    Diagnosis,
    ExpectedEffect,
    Intervention,
    PlanInput,
    Verdict,
)
from evotrainer.base.errors import UserError
from evotrainer.graph.events import EventLog
from evotrainer.graph.lessons import lesson_of, trigger_for
from evotrainer.graph.nodes import Loop
from evotrainer.graph.state import CandidateState, LoopState
from evotrainer.memory.distill import MERGE_SIMILARITY, distill, trigger_of
from evotrainer.memory.embeddings import HashingEmbedding, MiniLMEmbedding
from evotrainer.memory.skill import Skill, Trigger, Validation
from evotrainer.memory.store import SkillStore
from evotrainer.trainer.backtest import BacktestResult, ShortRunResult
from evotrainer.trainer.diagnostics import Finding
from evotrainer.trainer.diagnostics.report import HealthReport
from evotrainer.workspaces import TEMPLATES
from evotrainer.workspaces.run import RunWorkspace
from tests.conftest import run_cli

CORPUS = json.loads((Path(__file__).parent / "data" / "skill_corpus.json").read_text())


def corpus_skills() -> list[Skill]:
    return [Skill(id=s["key"], trigger=Trigger(text=s["trigger"], analyzers=s["analyzers"]), factor=s["factor"],
                  intervention=s["change"],
                  validations=[Validation(domain=s["domain"], verdict="promote" if s["outcome"] == "positive"
                                          else "reject", effect=0.03 if s["outcome"] == "positive" else -0.01,
                                          ci_low=0.01 if s["outcome"] == "positive" else -0.03,
                                          ci_high=0.05 if s["outcome"] == "positive" else 0.01, seeds=2, steps=30)])
            .recompute() for s in CORPUS["skills"]]


@pytest.fixture(scope="module")
def corpus_store(tmp_path_factory) -> SkillStore:
    store = SkillStore(tmp_path_factory.mktemp("skills") / "store")
    store.put(corpus_skills())
    return store


def tree_digest(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode() + f.read_bytes())
    return h.hexdigest()


def test_reopened_in_a_fresh_process_with_filters(corpus_store):
    assert corpus_store.embedding == "minilm" and len(corpus_store) == len(CORPUS["skills"])
    code = (f"from evotrainer.memory.store import SkillStore; import json; s = SkillStore({str(corpus_store.path)!r});"
            "h = s.query('programs that throw errors are scored as passing', k=3, domain='code', outcome='negative');"
            "print(json.dumps([s.embedding, len(s), [x.skill.id for x in h], [x.id for x in "
            "s.list(domain='swe', outcome='negative')]]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    embedding, n, hits, swe_negative = json.loads(out.stdout.strip().splitlines()[-1])
    assert embedding == "minilm" and n == len(CORPUS["skills"])
    assert hits[0] == "code_crash_pass"
    assert all(CORPUS["skills"][[s["key"] for s in CORPUS["skills"]].index(h)]["domain"] == "code" for h in hits)
    assert sorted(swe_negative) == sorted(s["key"] for s in CORPUS["skills"]
                                          if s["domain"] == "swe" and s["outcome"] == "negative")
    by_factor = corpus_store.list(factor="recipe.learning_rate")
    assert {s.id for s in by_factor} == {"kl_blowup", "lr_too_small"}


def _top1(store: SkillStore, with_signature: bool) -> float:
    hits = [store.query(q["text"], k=1, analyzers=q["analyzers"] if with_signature else None, record=False)[0]
            for q in CORPUS["queries"]]
    return sum(h.skill.id == q["skill"] for h, q in zip(hits, CORPUS["queries"])) / len(hits)


def test_retrieval_quality_on_paraphrased_diagnoses(corpus_store, tmp_path):
    assert len(CORPUS["skills"]) >= 40 and len(CORPUS["queries"]) >= 20
    hashing = SkillStore(tmp_path / "hashing", embedding="hashing")
    hashing.put(corpus_skills())
    figures = {(name, sig): _top1(store, sig) for name, store in [("minilm", corpus_store), ("hashing", hashing)]
               for sig in (False, True)}
    print("top-1 accuracy over", len(CORPUS["queries"]), "paraphrased diagnoses:",
          ", ".join(f"{n} {'text+analyzers' if s else 'text only'} {v:.2f}" for (n, s), v in figures.items()))
    assert figures[("minilm", True)] >= 0.9  # what the Planner does: the diagnosis text and its findings' analyzers
    assert figures[("minilm", False)] >= 0.7 and figures[("minilm", False)] > figures[("hashing", False)]


def test_query_records_retrievals_and_use(tmp_path):
    store = SkillStore(tmp_path / "s", embedding="hashing")
    store.put(corpus_skills()[:5])
    hits = store.query("every sample in the group is wrong", k=2)
    assert len(hits) == 2 and all(h.skill.retrieved == 1 for h in hits)
    assert store.get(hits[0].skill.id).retrieved == 1
    store.query("every sample in the group is wrong", k=2, record=False)
    assert store.get(hits[0].skill.id).retrieved == 1
    store.record_use(hits[0].skill.id)
    skill = store.record_outcome_after_use(hits[0].skill.id, "positive")
    assert skill.used == 1 and skill.outcomes_after_use == ["positive"]
    assert store.get(skill.id).model_dump() == skill.model_dump()


def test_export_then_import_round_trips_every_field(corpus_store, tmp_path):
    corpus_store.record_use("swe_leak")
    corpus_store.record_outcome_after_use("swe_leak", "negative")
    exported = tmp_path / "skills.jsonl"
    assert corpus_store.export(exported) == len(corpus_store)
    fresh = SkillStore(tmp_path / "fresh")
    assert fresh.import_(exported) == (len(corpus_store), 0)
    assert {s.id: s.model_dump() for s in fresh.list()} == {s.id: s.model_dump() for s in corpus_store.list()}
    assert fresh.get("swe_leak").outcomes_after_use == ["negative"]
    assert fresh.import_(exported) == (0, len(corpus_store))  # ids already present are kept
    bad = tmp_path / "bad.jsonl"
    bad.write_text(exported.read_text().splitlines()[0] + "\n{\"id\": \"x\"}\n")
    empty = SkillStore(tmp_path / "empty")
    with pytest.raises(UserError, match=r"bad.jsonl:2 is not a skill record .*nothing imported"):
        empty.import_(bad)
    assert len(empty) == 0


def _backtest(delta: float, lo: float, hi: float, branch: str, commit: str, gates: list[str] = ()) -> BacktestResult:
    short = ShortRunResult(steps=30, seeds=[0, 1], dev_items=2000, arms=[], per_seed_delta=[delta, delta],
                           delta=delta, ci_low=lo, ci_high=hi, se=(hi - lo) / 3.92, mde=0.01, train_reward_delta=0.0,
                           train_correct_delta=0.0, findings=[], failed_gates=list(gates), stopped="significant",
                           trace=[], seconds=1.0, seconds_per_arm=0.5)
    return BacktestResult(run="r1", branch=branch, commit=commit, champion_commit="c0", generation=1,
                          start_checkpoint=None, replay=None, short_run=short, failed_gates=list(gates), seconds=1.0)


DEAD = [Finding(analyzer="dead_groups", metric="dead_group_ratio", value=0.41, threshold=0.3, severity="critical",
                message="41% of groups have zero reward variance (35% all wrong, 6% all right); worst at difficulty 5")]
DEAD_AGAIN = [DEAD[0].model_copy(update={"value": 0.38, "message": "38% of groups have zero reward variance (33% all "
                                                                   "wrong, 5% all right); worst at difficulty 4"})]
DROP = Intervention(id="i1", hypothesis="if we drop dead groups, dev improves because the loss is not diluted",
                    factor="filters.dead_groups", change="drop zero-variance groups", transform="drop_dead_groups",
                    expected=ExpectedEffect(size=0.01))


@pytest.mark.parametrize("embedding", ["minilm", "hashing"])
def test_distilling_the_same_lesson_twice_merges_the_evidence(tmp_path, embedding):
    store = SkillStore(tmp_path / "s", embedding=embedding)

    def learn(iv, branch, decision, domain, findings, bt, **verdict):
        return distill(store, lesson_of(iv, Verdict(branch=branch, decision=decision, **verdict), domain,
                                        findings=findings, backtest=bt))
    first, merged = learn(DROP, "cand/g1-drop", "promote", "math", DEAD, _backtest(0.02, 0.004, 0.036, "cand/g1-drop",
                                                                                   "aaa"))
    assert not merged and first.outcome == "positive" and first.trigger.analyzers == ["dead_groups"]
    again, merged = learn(DROP, "cand/g1-drop", "promote", "math", DEAD, _backtest(0.02, 0.004, 0.036, "cand/g1-drop",
                                                                                   "aaa"))
    assert merged and again.id == first.id and len(again.validations) == 1  # the same backtest adds nothing
    # a later run, another diagnosis text of the same failure, a weaker effect: one skill, combined evidence
    second, merged = learn(DROP, "cand/g3-drop", "reject", "math", DEAD_AGAIN,
                           _backtest(0.0, -0.016, 0.016, "cand/g3-drop", "bbb"))
    assert merged and second.id == first.id and len(store) == 1 and len(second.validations) == 2
    assert 0.0 < second.effect < 0.02 and second.ci_high - second.ci_low < 0.032  # inverse-variance combination
    # the same factor in another domain, positive again: general
    code_dead = [DEAD[0].model_copy(update={"message": "57% of groups all fail the hidden tests"})]
    third, merged = learn(DROP, "cand/g1-drop", "promote", "code", code_dead,
                          _backtest(0.03, 0.01, 0.05, "cand/g1-drop", "ccc"))
    assert merged and third.general and third.domains == ["code", "math"]
    assert [s.id for s in store.list(domain="swe")] == [first.id]  # general skills show in every domain
    # another factor after the same diagnosis is another lesson; a gate makes it negative whatever its effect
    temp = DROP.model_copy(update={"factor": "recipe.temperature", "change": "temperature 1.2", "transform": None})
    other, merged = learn(temp, "cand/g2-temp", "reject", "math", DEAD, _backtest(0.05, 0.02, 0.08, "cand/g2-temp",
                                                                                  "ddd"),
                          failed_gates=["shaped_vs_sealed"])
    assert not merged and other.outcome == "negative" and "blocked by shaped_vs_sealed" in other.lesson
    assert len(store) == 2


def test_merge_threshold_separates_repeats_from_other_situations():
    """Repeats of one analyzer message score above MERGE_SIMILARITY; different situations sharing a factor below."""
    by = {s["key"]: s["trigger"] for s in CORPUS["skills"]}
    same = [(DEAD[0].message, DEAD_AGAIN[0].message),
            ("17% of completions truncated (17% masked out of the loss); worst at difficulty 5 (60%)",
             "23% of completions truncated (23% masked out of the loss); worst at difficulty 5 (71%)")]
    different = [(by["kl_blowup"], by["lr_too_small"]), (by["format_failures"], by["component_dominance"]),
                 (by["truncation"], by["mask_truncated"])]
    for name, ef in [("minilm", MiniLMEmbedding()), ("hashing", HashingEmbedding())]:
        sim = [float(a @ b) for a, b in (ef(list(p)) for p in same + different)]
        assert min(sim[:len(same)]) >= MERGE_SIMILARITY[name] > max(sim[len(same):]), (name, sim)


def test_trigger_of_keeps_the_severe_findings():
    info = Finding(analyzer="reward_spread", metric="m", value=0.1, severity="info", message="fine")
    trig = trigger_of(DEAD + [info], "")
    assert trig.analyzers == ["dead_groups"] and trig.text == DEAD[0].message
    assert trig.signature == "dead_groups:critical=0.41"
    assert trigger_of(DEAD, "the hard levels never succeed").text == "the hard levels never succeed"


TRUNC = Finding(analyzer="truncation", metric="truncated_ratio", value=0.17, threshold=0.05, severity="critical",
                message="17% of completions hit the length limit (17% masked out of the loss); worst at difficulty 5")


def test_each_candidate_of_a_generation_keeps_the_diagnosis_it_answered(tmp_path):
    """The distill node gives each candidate's skill the part of the plan's diagnosis that candidate answered: two
    candidates of one generation citing different findings leave different triggers with their own analyzer ids (an
    exploration, citing none, the whole diagnosis), so a later diagnosis of one symptom finds its skill first instead
    of three skills tied on one generation's concatenated messages."""
    findings, policy = [DEAD[0], TRUNC], OfflinePolicy()
    report = HealthReport(generation=1, branch="main", n_rollouts=320, n_steps=10, summary={}, findings=findings,
                          failed_gates=[], seconds=0.0)
    diagnosis = policy.diagnose(DiagnoseInput(generation=1, report=report))
    files = {p: (TEMPLATES / "math" / p).read_text() for p in ("harness.yaml", "rewards.py", "filters.py")}
    plan = policy.plan(PlanInput(generation=1, domain="math", k=10, diagnosis=diagnosis, findings=findings,
                                 files=files))
    by = {iv.transform: iv for iv in plan.interventions}
    ws = RunWorkspace.create(tmp_path / "run", "math")
    store = SkillStore(tmp_path / "skills")
    cands = [CandidateState(intervention=by[t], branch=f"cand/g1-{t}", commit=t,
                            backtest=_backtest(-0.01, -0.03, 0.01, f"cand/g1-{t}", t),
                            verdict=Verdict(branch=f"cand/g1-{t}", decision="reject", effect=-0.01))
             for t in ("drop_dead_groups", "longer_limit", "loss_type")]
    Loop(ws, policy, store, EventLog(ws.path / "events.jsonl")).distill(
        LoopState(findings=findings, diagnosis=diagnosis, candidates=cands))
    got = {s.transform: s.trigger for s in store.list()}
    assert (got["drop_dead_groups"].text, got["drop_dead_groups"].analyzers) == (DEAD[0].message, ["dead_groups"])
    assert (got["longer_limit"].text, got["longer_limit"].analyzers) == (TRUNC.message, ["truncation"])
    assert (got["loss_type"].text, got["loss_type"].analyzers) == (diagnosis.summary, ["dead_groups", "truncation"])
    later = "39% of groups have zero reward variance (34% all failed, 5% all solved): their gradient is zero"
    hits = store.query(later, k=3, analyzers=["dead_groups"], record=False)
    assert hits[0].skill.transform == "drop_dead_groups" and hits[0].score - hits[1].score > 0.1
    # an LLM's plan may cite an analyzer id alone, and its Diagnoser words the bottleneck its own way
    worded = Diagnosis(generation=1, summary="answers are cut off; groups are flat", bottlenecks=[
        Bottleneck(title="answers are cut off at the length limit", findings=["truncation:truncated_ratio"])])
    llm = trigger_for(by["longer_limit"].model_copy(update={"sources": ["truncation", "sk-0"]}), findings, worded)
    assert (llm.text, llm.analyzers) == ("answers are cut off at the length limit", ["truncation"])


def test_bad_store_paths_are_one_line_and_leave_the_store_untouched(corpus_store, tmp_path):
    before = tree_digest(corpus_store.path)
    res = run_cli("skills", "list", "--skills", str(corpus_store.path), "--embedding", "hashing")
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "built with the 'minilm' embedding, not 'hashing'" in res.stderr
    assert tree_digest(corpus_store.path) == before

    a_file = tmp_path / "file"
    a_file.write_text("x")
    not_store = tmp_path / "notes"
    not_store.mkdir()
    (not_store / "todo.txt").write_text("keep me")
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "chroma.sqlite3").write_bytes(b"this is not a database" * 100)
    cases = {a_file: "is a file, not a folder", not_store: "is not a skill store", corrupt: "is corrupt"}
    for path, message in cases.items():
        digest = path.read_bytes() if path.is_file() else tree_digest(path)
        res = run_cli("skills", "query", "dead groups", "--skills", str(path))
        assert res.returncode == 2 and message in res.stderr and res.stderr.count("\n") == 1, res.stderr
        assert (path.read_bytes() if path.is_file() else tree_digest(path)) == digest
    res = run_cli("skills", "show", "nope", "--skills", str(corpus_store.path))
    assert res.returncode == 2 and "no skill 'nope'" in res.stderr


def test_cli_list_query_show_export_import(corpus_store, tmp_path):
    res = run_cli("skills", "list", "--domain", "swe", "--outcome", "positive", "--json", "--skills",
                  str(corpus_store.path))
    listed = json.loads(res.stdout)
    assert res.returncode == 0 and listed and all(s["outcome"] == "positive" and "swe" in s["domains"]
                                                  for s in listed)
    res = run_cli("skills", "query", "solved episodes copy the fix from the repository history", "--k", "2", "--json",
                  "--analyzer", "leak_usage",
                  "--skills", str(corpus_store.path))
    hits = json.loads(res.stdout)
    assert res.returncode == 0 and hits[0]["skill"]["id"] == "swe_leak" and len(hits) == 2
    res = run_cli("skills", "show", "swe_leak", "--skills", str(corpus_store.path))
    assert res.returncode == 0 and "env.history_tool" in res.stdout and "disable the history tool" in res.stdout
    out = tmp_path / "e.jsonl"
    assert run_cli("skills", "export", str(out), "--skills", str(corpus_store.path)).returncode == 0
    res = run_cli("skills", "import", str(out), "--skills", str(tmp_path / "new"), "--embedding", "hashing")
    assert res.returncode == 0 and f"imported {len(corpus_store)} skills" in res.stdout
    assert SkillStore(tmp_path / "new").embedding == "hashing"


def test_a_promoted_repair_is_a_positive_lesson_at_a_dev_cost():
    """A candidate that closed a leak the champion's gate caught is promoted though the leaky control scored
    higher on dev: memory keeps it as positive (so a later Planner proposes it first), with the cost in its effect."""
    def skill(*validations):
        return Skill(trigger=Trigger(text="leak"), factor="env.tools", intervention="remove history",
                     validations=list(validations)).recompute()

    repair = Validation(domain="swe", verdict="promote", effect=-0.058, ci_low=-0.110, ci_high=-0.007, seeds=2,
                        repairs=["leak_usage"])
    cost = skill(repair)
    assert cost.outcome == "positive" and cost.effect == pytest.approx(-0.058, abs=0.01)
    assert skill(repair.model_copy(update={"repairs": []})).outcome == "negative"  # a plain loss: nothing to copy
    # rejected on its dev score, a repair is no lesson against itself: that score is against a champion failing a
    # gate, and it is still the one change that passed it; a plain test measured harmful beside it still counts
    rejected = repair.model_copy(update={"verdict": "reject"})
    assert skill(rejected).outcome == "inconclusive"
    plain = Validation(domain="swe", verdict="reject", effect=-0.04, ci_low=-0.07, ci_high=-0.01, seeds=1)
    assert skill(rejected, plain).outcome == "negative" and skill(plain).outcome == "negative"
    still_gated = repair.model_copy(update={"failed_gates": ["leak_usage"]})
    assert skill(still_gated).outcome == "negative"
    v = Verdict(branch="cand/g1-close-leak", decision="promote", effect=-0.058, ci_low=-0.11, ci_high=-0.007,
                repairs=["leak_usage"])
    from evotrainer.graph.lessons import validation_of

    assert validation_of(v, "swe").repairs == ["leak_usage"]


def test_a_command_that_opens_no_store_does_not_import_chroma():
    """Every `evotrainer` command imports the agents' schemas, which name the store's types; Chroma (about a second
    of CPU) is imported only when a store is opened."""
    probe = ("import sys, evotrainer.cli; assert 'chromadb' not in sys.modules; "
             "from evotrainer.memory.store import SkillStore; SkillStore(sys.argv[1], 'hashing'); "
             "assert 'chromadb' in sys.modules")
    res = subprocess.run([sys.executable, "-c", probe, "/nonexistent-store"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
