"""The nodes of one generation (DESIGN §1), as plain functions from the state to a partial update.

`Loop` holds what nodes share but the state does not (the run workspace, the meta-policy, the skill store,
the event log, the progress display). Every node is safe to re-enter after a kill: training resumes from its
TRL checkpoint, short-run arms and backtest reports are reused when present, a candidate branch left without
a commit is discarded and recreated, verdicts already tagged are not re-applied, distillation skips what it
has already recorded.

Rollout text reaches agents only inside `Sample` objects, quoted as data.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from evotrainer.agents.coder import EditFailed, apply_edits, harness_files
from evotrainer.agents.critic import choose, judge
from evotrainer.agents.meta_policy import MetaPolicy
from evotrainer.agents.offline.catalog import CATALOG
from evotrainer.agents.schemas import (
    CodeInput,
    CritiqueInput,
    DiagnoseInput,
    LineageEntry,
    PlanInput,
    ReviseInput,
    Sample,
    VerdictRecord,
)
from evotrainer.base.errors import UserError
from evotrainer.base.files import atomic_write_text
from evotrainer.graph.events import EventLog
from evotrainer.graph.lessons import lesson_of
from evotrainer.graph.state import CandidateState, GenerationRecord, LoopState
from evotrainer.memory.distill import MERGE_SIMILARITY, distill, trigger_of
from evotrainer.memory.prior import applied_again, prior_for, priors_for
from evotrainer.memory.store import SkillStore
from evotrainer.trainer import jobs
from evotrainer.trainer.backtest import arm_tag, backtest_all
from evotrainer.trainer.backtest.replay import critical_defects, gate_keys
from evotrainer.trainer.evidence import adopt, read_rollouts
from evotrainer.workspaces.repo import BranchRecord
from evotrainer.workspaces.run import RunWorkspace

SAMPLES = 6


def tried_on(lineage: list[BranchRecord], head: str) -> list[str]:
    """The factors tried on the champion commit `head`, which the Planner may not propose again, less one whose only
    test there was not promoted and either
    - inconclusive with a positive estimate: that one may be tested once more, from the main line's later checkpoint
      with arms of its own, and memory's prior pools the two measurements (the first is in the store), so a
      promising change is extended until its answer is clear instead of dropped after one short run; or
    - a repair of a gate the champion fails (its verdict's `repairs`, `agents/critic.py::repairs_of`), not
      promoted: while the champion fails a gate no other change can be promoted (each inherits the failure), so
      the one change that repaired it is worth a second short run rather than a generation spent on candidates that
      cannot win."""
    tests: dict[str, list[BranchRecord]] = {}
    for r in lineage:
        if r.parent == head and r.factor:
            tests.setdefault(r.factor, []).append(r)

    def again(r: BranchRecord) -> bool:
        return r.status != "promoted" and (bool(r.repairs) or (r.status == "inconclusive" and (r.effect or 0.0) > 0))

    return sorted(f for f, rs in tests.items() if not (len(rs) == 1 and again(rs[0])))


class Loop:
    def __init__(self, ws: RunWorkspace, meta: MetaPolicy, store: SkillStore, events: EventLog,
                 feed: Callable[[str], Callable[[dict], None]] | None = None,
                 status: Callable[[str], None] | None = None):
        self.ws, self.cfg, self.meta, self.store, self.events = ws, ws.config(), meta, store, events
        self.feed = feed or (lambda label: (lambda event: None))
        self.status = status or (lambda text: None)
        self.rule = self.cfg.loop.rule()

    # -- plumbing ------------------------------------------------------------------------------
    def node(self, name: str, fn: Callable[[LoopState], dict]) -> Callable[[LoopState], dict]:
        """`fn` with start/end events and its wall time added to the state's budget."""
        def run(state: LoopState) -> dict:
            g = state.generation
            self.status(f"generation {g}: {name}")
            self.events.emit("start", node=name, generation=g)
            started, spent = time.time(), self.meta_dollars()
            update = fn(state)
            seconds = round(time.time() - started, 2)
            dollars = self.meta_dollars() - spent
            self.events.emit("end", node=name, generation=g, seconds=seconds, dollars=round(dollars, 6))
            return {**update, "seconds_used": round(state.seconds_used + seconds, 2),
                    "llm_dollars": state.llm_dollars + dollars}
        run.__name__ = name
        return run

    def meta_dollars(self) -> float:
        """The meta-policy's spend in this process (the offline one spends nothing)."""
        return float(self.meta.dollars)

    def champion_dir(self) -> Path:
        """A snapshot of the champion harness (training and agents read it; nobody edits it)."""
        return self.ws.snapshot("main")[1]

    def _evaluate(self, checkpoint: Path, out: Path) -> float:
        return jobs.evaluate(checkpoint, self.cfg.domain, "dev", out, k=0, limit=self.cfg.loop.backtest.dev_items,
                             seed=self.cfg.seed, expected_fingerprint=self.cfg.fingerprint).accuracy

    # -- train ---------------------------------------------------------------------------------
    def horizon(self) -> int:
        return self.cfg.loop.horizon(self.cfg.budget.generations)

    def train(self, state: LoopState) -> dict:
        """The champion harness continues the main line: one training line across generations (its optimizer,
        schedule, RNG and data order carry over in the checkpoint's kept state), so that with nothing promoted the
        main line is the reference's training, step for step. Its rollouts are the evidence of generation g-1. A
        segment the previous generation's control arm of seed 0 already trained (the same harness, state and
        steps) is adopted, not trained again."""
        from evotrainer.trainer.grpo import TrainSpec

        g, ws = state.generation, self.ws
        start = Path(state.checkpoint) if state.checkpoint else \
            ws.starting_policy(self.feed("warm-up (SFT, cached)"))
        champ_commit, champ = ws.snapshot("main")
        out = ws.path / "checkpoints" / f"g{g}-train"
        steps = self.cfg.loop.train_steps
        spec = TrainSpec(domain=self.cfg.domain, checkpoint=str(start), harness_dir=str(champ), steps=steps,
                         seed=self.cfg.seed, horizon=self.horizon(), keep_state=True,
                         **jobs.continuation(start, champ), out_dir=str(out),
                         checkpoint_id="policy", checkpoints_dir=str(out / "checkpoints"),
                         evidence_dir=str(ws.path / "evidence"), run=ws.path.name, generation=g - 1, branch="main",
                         harness_commit=champ_commit, result_path=str(out / "specs" / "train.result.json"))
        before: dict = {}
        thread = None
        if state.dev_start is None:  # the starting policy's score, side by side with training (one core each)
            def eval_start() -> None:
                try:
                    before["dev"] = self._evaluate(start, ws.path)
                except UserError as e:
                    before["error"] = e
            thread = threading.Thread(target=eval_start)
            thread.start()
        trained = 0
        try:
            ckpt = out / "checkpoints" / "policy"
            shared = self._trained_by_control(g, spec) if not (ckpt / "meta.json").is_file() else None
            if shared is not None:
                ckpt = shared
                adopt(ws.path / "evidence", g - 1, "control", arm_tag(champ_commit, 0, steps), "main")
                self.events.emit("decision", node="train", generation=g, adopted=str(shared),
                                 reason="the previous generation's control arm of seed 0 trained this segment")
            elif not (ckpt / "meta.json").is_file():
                jobs.train(spec, out, on_progress=self.feed(f"g{g} train champion"))
                trained = steps
        finally:
            if thread:
                thread.join()
        if "error" in before:
            raise before["error"]
        dev = self._evaluate(ckpt, out)
        ws.set_champion(ckpt, g)
        return {"checkpoint": str(ckpt), "trained": str(ckpt), "dev_start": before.get("dev", state.dev_start),
                "dev_trained": dev, "steps_used": state.steps_used + trained}

    def _trained_by_control(self, g: int, spec) -> Path | None:
        """The previous generation's control arm of seed 0 when it is exactly this segment: the champion harness
        at the same commit, from the same policy and state, the same steps on the same line, sampling as the line
        does (no reseed). Its evidence (generation g-1, like this segment's) is adopted as the main line's."""
        if g < 2:
            return None
        arm = self.ws.path / "backtests" / f"g{g - 1}" / "control" / arm_tag(spec.harness_commit, 0, spec.steps)
        ckpt = arm / "checkpoints" / "policy"
        if not (ckpt / "meta.json").is_file():
            return None
        meta = json.loads((ckpt / "meta.json").read_text())
        same = (Path(meta.get("parent", "")).resolve() == Path(spec.checkpoint).resolve()
                and meta.get("harness_commit") == spec.harness_commit and meta.get("steps") == spec.steps
                and meta.get("horizon") == spec.horizon and meta.get("seed") == spec.seed
                and meta.get("reseed") is None and meta.get("continued") == spec.resume_state
                and not meta.get("fresh_optimizer") and meta.get("state"))
        return ckpt if same else None

    # -- diagnose ------------------------------------------------------------------------------
    def diagnose(self, state: LoopState) -> dict:
        from evotrainer.trainer.diagnostics.report import health_report, write_report

        g, ws = state.generation, self.ws
        champ = self.champion_dir()
        report = health_report(ws.path, g - 1, "main", champ, ws.path)
        write_report(report, ws.path / "reports")
        rows = read_rollouts(ws.path / "evidence", g - 1, "main").to_pandas()

        def samples(df) -> list[Sample]:
            return [Sample(rollout_id=r.rollout_id, prompt=r.prompt, completion=r.completion, reward=float(r.reward),
                           correct=bool(r.correct), truncated=bool(r.truncated)) for r in df.itertuples()]
        worst = rows.sort_values(["reward", "correct"]).head(SAMPLES)
        rand = rows.sample(min(SAMPLES, len(rows)), random_state=self.cfg.seed + g)
        previous = [r for r in (state.diagnosis,) if r is not None]
        diagnosis = self.meta.diagnose(DiagnoseInput(generation=g, report=report, worst=samples(worst),
                                                     random=samples(rand), previous=previous))
        atomic_write_text(ws.path / "reports" / f"diagnosis-g{g}.json", diagnosis.model_dump_json(indent=2))
        return {"findings": report.findings, "diagnosis": diagnosis}

    # -- plan ----------------------------------------------------------------------------------
    def lineage(self, records: list[BranchRecord] | None = None) -> list[LineageEntry]:
        """The candidate branches (`records`: the repository's, read if not given) with their verdicts' transforms."""
        out = []
        for r in records if records is not None else self.ws.harness.lineage():
            record = VerdictRecord.load(self.ws.verdict_path(r.branch))
            transform = record.transform if record else None
            out.append(LineageEntry(generation=r.generation, branch=r.branch, factor=r.factor, transform=transform,
                                    status=r.status, effect=r.effect, reason=r.reason))
        return out

    def applied(self, lineage: list[LineageEntry] | None = None) -> dict[str, int]:
        """The catalog transforms promoted on the champion's line (`lineage`, read if not given), each with the
        generation of its last promotion."""
        return {e.transform: e.generation for e in (lineage if lineage is not None else self.lineage())
                if e.status == "promoted" and e.transform}

    def plan(self, state: LoopState) -> dict:
        g, ws = state.generation, self.ws
        trigger = trigger_of(state.findings, state.diagnosis.summary)
        hits = self.store.query(trigger.text, k=10, domain=self.cfg.domain, analyzers=trigger.analyzers) \
            if self.cfg.loop.skill_memory else []
        head = ws.harness.head("main")
        records = ws.harness.lineage()
        tried = tried_on(records, head)
        # what memory measured of each change, in any run and domain: the Planner's expected gains
        lineage = self.lineage(records)
        applied = self.applied(lineage)
        priors = {t: applied_again(p, applied[t], self.rule.prior_sd) if t in applied else p
                  for t, p in priors_for(self.store, list(CATALOG), self.rule.prior_sd, self.cfg.domain).items()} \
            if self.cfg.loop.skill_memory else {}
        plan = self.meta.plan(PlanInput(generation=g, domain=self.cfg.domain, k=self.cfg.budget.candidates,
                                        diagnosis=state.diagnosis, findings=state.findings, skills=hits,
                                        lineage=lineage, files=harness_files(self.champion_dir()),
                                        tried=tried, same_diagnosis=MERGE_SIMILARITY[self.store.embedding],
                                        priors=priors, prior_sd=self.rule.prior_sd))
        for sid in {s for iv in plan.interventions for s in iv.sources if s.startswith("sk-")}:
            self.store.record_use(sid)
        atomic_write_text(ws.path / "reports" / f"plan-g{g}.json", plan.model_dump_json(indent=2))
        for iv in plan.interventions:
            self.events.emit("decision", node="plan", generation=g, intervention=iv.id, factor=iv.factor,
                             transform=iv.transform, hypothesis=iv.hypothesis)
        return {"plan": plan, "candidates": [CandidateState(intervention=iv) for iv in plan.interventions]}

    # -- implement -----------------------------------------------------------------------------
    def implement(self, state: LoopState) -> dict:
        g, ws, repo = state.generation, self.ws, self.ws.harness
        existing = {}
        for r in repo.lineage():
            if not r.branch.startswith(f"cand/g{g}-"):
                continue
            if repo.has_own_commit(r.branch):
                existing[r.intervention_id] = r
            else:  # left by an interrupted implement: a branch with no commit of its own
                repo.discard(r.branch)
        files = harness_files(self.champion_dir())
        out = []
        for cand in state.candidates:
            cand = cand.model_copy(deep=True)
            iv = cand.intervention
            rec = existing.get(iv.id)
            if rec:
                cand.branch, cand.commit = rec.branch, rec.head
                out.append(cand)
                continue
            # an LLM plan's id already carries the generation (`g1-recipe-temperature`): not `cand/g1-g1-...`
            try:
                branch, tree = repo.create_candidate(g, iv.transform or iv.id.removeprefix(f"g{g}-"),
                                                     ws.path / "worktrees")
            except UserError as e:  # the candidate cannot be materialised: rejected with its reason, the run goes on
                cand.error = f"not implemented: {e}"
                out.append(cand)
                continue
            self.status(f"generation {g}: implement {branch}")
            error = ""
            for attempt in range(self.cfg.loop.repair_rounds + 1):
                cand.attempts = attempt + 1
                try:
                    repo.reset_worktree(tree)
                    result = self.meta.code(CodeInput(intervention=iv, files=files, findings=state.findings,
                                                      diagnosis=state.diagnosis, error=error, attempt=attempt))
                    changed = apply_edits(files, result.edits)
                    repo.write_files(tree, changed)
                except (EditFailed, UserError, ValueError) as e:
                    error = str(e)
                    self.events.emit("repair", node="implement", generation=g, branch=branch, attempt=attempt,
                                     error=error)
                    continue
                problems = jobs.validate_harness(tree, ws.path, label=f"candidate {branch}")
                if problems:
                    error = problems[0]
                    self.events.emit("repair", node="implement", generation=g, branch=branch, attempt=attempt,
                                     error=error)
                    continue
                try:  # exactly the edited paths, regular files only (workspaces/repo.py refuses anything else)
                    cand.commit = repo.commit(tree, result.message, intervention_id=iv.id, hypothesis=iv.hypothesis,
                                              factor=iv.factor, generation=g, paths=list(changed))
                except UserError as e:
                    error = str(e)
                    self.events.emit("repair", node="implement", generation=g, branch=branch, attempt=attempt,
                                     error=error)
                    continue
                cand.branch, error = branch, ""
                break
            if not cand.commit:
                cand.error = f"not implemented after {cand.attempts} attempts: {error}"
                repo.discard(branch)
            out.append(cand)
        return {"candidates": out}

    # -- backtest ------------------------------------------------------------------------------
    def backtest(self, state: LoopState) -> dict:
        """Every implemented candidate, replayed first, then short-run against the shared control arms
        (`trainer.backtest.backtest_all`: the one place arms are scheduled)."""
        g, ws = state.generation, self.ws
        cands = [c.model_copy(deep=True) for c in state.candidates]
        todo = [ws.harness_at(c.branch, c.commit) for c in cands if c.commit]
        results = backtest_all(ws.bench(g), todo, self.cfg.loop.backtest, short_runs=self.cfg.loop.short_runs,
                               validated=True,  # implement commits nothing it has not validated
                               on_progress=lambda label: self.feed(f"g{g} {label}"), status=self.status) \
            if todo else {}
        steps, control_seeds = state.steps_used, set()
        for cand in cands:
            r = results.get(cand.branch) if cand.commit else None
            if isinstance(r, UserError):
                cand.error = f"backtest failed: {r}"
            elif r is not None:
                cand.backtest = r
                if r.short_run:
                    steps += len(r.short_run.seeds) * r.short_run.steps  # the candidate's arms; the control's below
                    control_seeds |= set(r.short_run.seeds)
        steps += len(control_seeds) * self.cfg.loop.backtest.steps
        return {"candidates": cands, "steps_used": steps}

    # -- critique ------------------------------------------------------------------------------
    def critique(self, state: LoopState) -> dict:
        g, ws = state.generation, self.ws
        verdicts, applied = [], self.applied()
        for cand in state.candidates:
            bt = cand.backtest
            iv = cand.intervention  # the prior: what memory measured of the same change (empirical Bayes)
            prior = prior_for(self.store, iv.transform, iv.factor, self.rule.prior_sd, self.cfg.domain) \
                if self.cfg.loop.skill_memory else None
            if prior and iv.transform in applied:
                prior = applied_again(prior, applied[iv.transform], self.rule.prior_sd)
            # a repair must repair a gate the main line fails on its own evidence (the diagnosis), not only a gate one
            # short run's control arms failed by chance; a fix, a defect the diagnosis shows at critical severity
            v = judge(iv, bt, self.rule, cand.error, prior, champion_gates=gate_keys(state.findings),
                      champion_defects=critical_defects(state.findings))
            v = v.model_copy(update={"branch": cand.branch or cand.intervention.id})
            verdicts.append(self.meta.critique(CritiqueInput(verdict=v, intervention=iv, backtest=bt,
                                                             findings=state.findings)))
        verdicts = choose(verdicts, self.rule)
        out = []
        for cand, v in zip(state.candidates, verdicts):
            cand = cand.model_copy(update={"verdict": v})
            out.append(cand)
            if cand.branch:
                VerdictRecord(**v.model_dump(), intervention=cand.intervention, author=self.meta.label,
                              generation=g).save(ws.verdict_path(cand.branch))
            self.events.emit("decision", node="critique", generation=g, branch=v.branch, decision=v.decision,
                             reasons=v.reasons)
        revise = [c.branch for c in out if c.verdict.decision == "revise"] if self.cfg.loop.revise_diagnostics else []
        return {"candidates": out, "revise": revise}

    # -- promote -------------------------------------------------------------------------------
    def promote(self, state: LoopState) -> dict:
        g, ws, repo = state.generation, self.ws, self.ws.harness
        status = {r.branch: r.status for r in repo.lineage()}
        checkpoint = state.checkpoint
        for cand in state.candidates:
            v = cand.verdict
            if v.decision == "promote":
                checkpoint = self._promoted_checkpoint(cand) or checkpoint
            if not cand.branch or status.get(cand.branch) != "open":
                continue  # never committed, or already tagged before an interruption
            record = VerdictRecord.load(ws.verdict_path(cand.branch)) or \
                VerdictRecord(**v.model_dump(), intervention=cand.intervention, author=self.meta.label, generation=g)
            tag = record.model_dump(mode="json")  # the tag carries the same record as the file
            if v.decision == "promote":
                repo.promote(cand.branch, g, tag)
            else:
                repo.reject(cand.branch, g, "; ".join(v.reasons) or v.decision, tag,
                            inconclusive=v.decision == "inconclusive")
            self.events.emit("decision", node="promote", generation=g, branch=cand.branch, decision=v.decision)
        if checkpoint != state.checkpoint:
            ws.set_champion(checkpoint, g)
        return {"checkpoint": checkpoint}

    def _first_arm(self, cand: CandidateState):
        """The candidate's first-seed short-run arm: the policy advances with the harness to this checkpoint."""
        bt = cand.backtest
        arms = [a for a in bt.short_run.arms if a.role == "candidate"] if bt and bt.short_run else []
        return min(arms, key=lambda a: a.seed) if arms else None

    def _promoted_checkpoint(self, cand: CandidateState) -> str | None:
        arm = self._first_arm(cand)
        return arm.checkpoint if arm else None

    # -- revise diagnostics --------------------------------------------------------------------
    def revise_diagnostics(self, state: LoopState) -> dict:
        """A new analyzer for the component that rose without dev (offline: a divergence gate; a meta-LLM's Coder
        writes its own), kept only if history agrees: it flags the branch that asked for it and no promoted one."""
        g, ws = state.generation, self.ws
        branch = state.revise[0]
        report = ws.path / "reports" / f"revision-g{g}.json"
        if report.is_file():  # re-entered after a kill: decided already (an LLM would write another analyzer)
            done = json.loads(report.read_text())
            if not done["committed"] or (ws.path / "harness" / "diagnostics" / f"{done['analyzer']}.py").is_file():
                return {"revised": done["analyzer"] if done["committed"] else None}
        cand = next(c for c in state.candidates if c.branch == branch)
        culprit = self._culprit(cand, g)
        change = self.meta.revision(ReviseInput(branch=branch, culprit=culprit, intervention=cand.intervention,
                                                verdict=cand.verdict, backtest=cand.backtest, findings=state.findings,
                                                files=harness_files(self.champion_dir())))
        if change is None:
            self.events.emit("decision", node="revise_diagnostics", generation=g, analyzer=None, committed=False,
                             reason=f"{self.meta.label} proposed no analyzer")
            return {"revised": None}
        path = next(iter(change.files))
        aid = Path(path).stem
        if (ws.path / "harness" / path).is_file():
            return {"revised": aid}
        trial = ws.path / "backtests" / f"revision-g{g}"
        shutil.rmtree(trial, ignore_errors=True)  # an earlier try's analyzer would be imported beside this one
        trial.mkdir(parents=True)
        for rel, text in {**harness_files(self.champion_dir()), **change.files}.items():
            atomic_write_text(trial / rel, text)
        try:
            val = ws.validate_analyzers(trial, [aid])
        except UserError as e:
            self.events.emit("decision", node="revise_diagnostics", generation=g, analyzer=aid, committed=False,
                             reason=str(e))
            return {"revised": None}
        flags = {s.branch: s.flagged for s in val.slices}
        keep = flags.get(branch, False) and val.false_alarms == 0
        atomic_write_text(report, json.dumps(
            {"analyzer": aid, "culprit": culprit, "branch": branch, "committed": keep, **val.model_dump()}, indent=2))
        self.events.emit("decision", node="revise_diagnostics", generation=g, analyzer=aid, committed=keep,
                         recall=val.recall, false_alarms=val.false_alarms)
        if not keep:
            return {"revised": None}
        ws.harness.commit_champion(change.files, f"Diagnostics revision: {change.change} (missed by every analyzer "
                                                 f"on {branch}; validated on history: recall {val.recall})")
        return {"revised": aid}

    def _culprit(self, cand: CandidateState, g: int) -> str:
        """The candidate's reward term whose pay rose most among equally correct rollouts, both arms scored under
        the candidate's reward (a new term the control lacks included); `reward` when none rose."""
        bt = cand.backtest
        cross = bt.short_run.cross if bt and bt.short_run else None
        terms = [t for t in cross.terms if t.harness == "candidate"] if cross else []
        # a term the change touched first: an unchanged one rising is the policy, not the harness edit
        risen = sorted((t for t in terms if t.within_delta > 0), key=lambda t: (t.status in ("new", "changed"),
                                                                                t.within_delta), reverse=True)
        return risen[0].term if risen else "reward"

    # -- distill -------------------------------------------------------------------------------
    def distill(self, state: LoopState) -> dict:
        g, ws = state.generation, self.ws
        for cand in state.candidates:
            v = cand.verdict
            if not cand.backtest or not self.cfg.loop.skill_memory:
                continue  # never measured (no lesson about the harness, only about the edit), or memory is off
            if v.decision == "reject" and v.failed_gates and set(v.failed_gates) <= set(v.inherited_gates):
                self.events.emit("distill", node="distill", generation=g, branch=cand.branch, skill=None,
                                 skipped=f"only gates the champion failed too ({', '.join(v.inherited_gates)}): "
                                         "no lesson about the change")
                continue
            bt = cand.backtest
            if bt.short_run and not bt.short_run.estimable and not v.failed_gates:
                self.events.emit("distill", node="distill", generation=g, branch=cand.branch, skill=None,
                                 skipped="one seed and no training-seed spread: the test could detect nothing, "
                                         "no lesson")
                continue
            # the trigger is the part of the plan's diagnosis this candidate answered, with its own analyzer ids
            skill, merged = distill(self.store, lesson_of(
                cand.intervention, v, self.cfg.domain, findings=state.findings, backtest=bt, run=ws.path.name,
                diagnosis=state.diagnosis or "", generation=g, commit=cand.commit))
            outcome = {"promote": "positive", "inconclusive": "inconclusive"}.get(v.decision, "negative")
            for sid in (s for s in cand.intervention.sources if s.startswith("sk-")):
                try:
                    self.store.record_outcome_after_use(sid, outcome)
                except UserError:
                    pass  # the skill was removed from the store meanwhile
            self.events.emit("distill", node="distill", generation=g, skill=skill.id, merged=merged,
                             outcome=skill.outcome, factor=skill.factor)
        winner = next((c for c in state.candidates if c.verdict and c.verdict.decision == "promote"), None)
        promoted = winner.branch if winner else None
        dev_end = self._first_arm(winner).dev_accuracy if winner else state.dev_trained
        record = GenerationRecord(
            generation=g, champion_commit=ws.harness.head("main"), checkpoint=state.checkpoint, trained=state.trained,
            dev_trained=state.dev_trained, dev_accuracy=dev_end, promoted=promoted,
            candidates=[c.branch or c.intervention.id for c in state.candidates],
            rejected=[f"{c.branch or c.intervention.id}: {'; '.join(c.verdict.reasons)}" for c in state.candidates
                      if c.verdict and c.verdict.decision != "promote"],
            revised=state.revised)
        return {"history": [*state.history, record], "generation": g + 1, "findings": [], "plan": None,
                "candidates": [], "revise": [], "revised": None}

    # -- routing -------------------------------------------------------------------------------
    def stop_reason(self, state: LoopState) -> str:
        b = self.cfg.budget
        if state.generation > b.generations:
            return f"{b.generations} generations done"
        if b.train_steps is not None and state.steps_used >= b.train_steps:
            return f"training-step budget spent ({state.steps_used} of {b.train_steps})"
        if b.wall_clock_s is not None and state.seconds_used >= b.wall_clock_s:
            return f"wall-clock budget spent ({state.seconds_used:.0f} s of {b.wall_clock_s:.0f} s)"
        if b.llm_dollars is not None and state.llm_dollars >= b.llm_dollars:
            return f"meta-LLM budget spent (${state.llm_dollars:.2f} of ${b.llm_dollars:.2f})"
        return ""
