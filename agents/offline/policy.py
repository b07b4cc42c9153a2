"""The offline meta-policy: deterministic rules over findings, the transform catalog, skill memory.

The embedded default when no meta-LLM is configured, and labelled as rule-based everywhere it writes.
- Diagnoser: the findings ranked by severity (gates first), each a bottleneck citing its rollouts.
- Planner: every catalog transform whose precondition holds and that either a fired finding calls for or that
  explores (a recipe-level change worth testing on any harness: `Transform.explore` > 0), scored by how strongly
  the findings call for it plus its expected gain under memory's prior (`memory.prior.expected_gain`, in units
  of what a change memory knows nothing of is expected to gain): a change measured near zero many times sinks,
  an untested one keeps its full exploration value, one measured positive rises. Ties (memory silent, no
  finding) go by `explore`, the order the literature and the template's own tuning suggest; with no finding, a
  change to a knob a promotion on this lineage set is not explored (only a finding reopens it). A positive skill for
  the transform (retrieved for a similar diagnosis) ranks it ahead of the rest, a negative skill (blocked by a
  gate, or measured harmful) recorded under the same diagnosis removes it, a negative one under another
  diagnosis lowers it; an inconclusive one does neither. The ranked list goes through the Planners' one filter
  (`agents/planner.py::admissible`: factors already tried on the current champion, negative lessons under the same
  diagnosis) and is cut to K.
- Coder: the transform's files, written whole (`agents/coder.py::catalog_edits`).
- Critic: the promotion rule alone (`agents/critic.py`).
- Diagnostics revision: a divergence gate for the component whose reward rose without dev.

It implements `agents/meta_policy.py::MetaPolicy`; what each agent is given is tabled there.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from evotrainer.agents.coder import catalog_edits
from evotrainer.agents.offline.catalog import CATALOG, Change, apply, divergence_gate_change
from evotrainer.agents.planner import admissible, same_diagnosis
from evotrainer.agents.schemas import (
    Bottleneck,
    CodeInput,
    CodeResult,
    CritiqueInput,
    DiagnoseInput,
    Diagnosis,
    Intervention,
    Plan,
    PlanInput,
    ReviseInput,
    Verdict,
)
from evotrainer.memory.prior import Prior, expected_gain
from evotrainer.trainer.diagnostics import Finding

LABEL = "offline rule-based meta-policy"
SEVERITY_WEIGHT = {"critical": 2.0, "warning": 1.0, "info": 0.3}
_ORDER = {"critical": 0, "warning": 1, "info": 2}


def finding_id(f: Finding) -> str:
    return f"{f.analyzer}:{f.metric}"


class OfflinePolicy:
    label = LABEL
    dollars = 0.0  # it calls no model

    def attach(self, run_dir: Path, on_call: Callable[[str, dict], None]) -> None:
        """Nothing to attach: no transcripts, no calls to account for."""

    def diagnose(self, inp: DiagnoseInput) -> Diagnosis:
        findings = sorted(inp.report.findings, key=lambda f: (not f.gate, _ORDER[f.severity], -abs(f.value)))
        bottlenecks = [Bottleneck(title=f.message, findings=[finding_id(f)], severity=f.severity,
                                  evidence=f.evidence[:5],
                                  explanation=f"{f.analyzer} {f.metric} = {f.value:.3g}"
                                              + (f" (threshold {f.threshold:g})" if f.threshold is not None else "")
                                              + (": a failed gate" if f.gate else ""))
                       for f in findings]
        severe = [b for b in bottlenecks if b.severity != "info"]
        if severe:
            summary = "; ".join(b.title for b in severe[:3])
        else:
            s = inp.report.summary
            summary = (f"no analyzer reports a problem: reward {s.get('reward_mean', 0):.3f}, correct rate "
                       f"{s.get('correct_rate', 0):.3f}, dead groups {s.get('dead_group_ratio', 0):.0%}; the "
                       "limit is the size of the updates or the data")
        return Diagnosis(generation=inp.generation, summary=summary, bottlenecks=bottlenecks, author=LABEL)

    def plan(self, inp: PlanInput) -> Plan:
        unknown = expected_gain(Prior.vague(inp.prior_sd))
        # the knobs promotions set on this lineage: exploration does not undo them, only a finding reopens one
        promoted = {k: e.transform for e in inp.lineage if e.status == "promoted" and e.transform in CATALOG
                    for k in CATALOG[e.transform].knobs}
        # a positive lesson of a change this lineage promoted is the lesson of that promotion: it does not prove that
        # applying the change again gains (a second learning-rate raise is a new change; only a finding calls for it)
        applied = {e.transform for e in inp.lineage if e.status == "promoted"}
        scored, undo = [], []
        for t in CATALOG.values():
            if t.kind == "diagnostics":
                continue
            change = apply(t.id, inp.files, inp.findings)
            if change is None:
                continue
            relevant = [f for f in inp.findings if f.analyzer in t.relevance]
            strongest: dict[str, float] = {}  # per analyzer: one analyzer firing on five levels is one reason
            for f in relevant:
                w = t.relevance[f.analyzer] * SEVERITY_WEIGHT[f.severity] * (1.5 if f.gate else 1.0)
                strongest[f.analyzer] = max(strongest.get(f.analyzer, 0.0), w)
            prior = inp.priors.get(t.id) or Prior.vague(inp.prior_sd)
            gain = expected_gain(prior) / unknown
            score = sum(strongest.values()) + gain
            proven, sources = False, [finding_id(f) for f in relevant]
            for hit in inp.skills:
                sk = hit.skill
                if sk.transform != t.id:
                    continue
                if sk.outcome == "positive" and t.id in applied:
                    continue
                if sk.outcome == "positive":
                    proven = True
                    score += hit.score
                elif sk.outcome == "negative" and not same_diagnosis(hit, inp):
                    score -= 0.5 * max(hit.score, 0.0)
                # inconclusive: not resolved, neither a reason to repeat it nor one to avoid it (the prior has its
                # effect); negative under this diagnosis: the shared filter below removes it
                sources.append(sk.id)
            if not (strongest or proven or t.explore > 0) or score <= 0:
                continue
            if not (strongest or proven) and (knob := next((k for k in t.knobs if k in promoted), None)):
                undo.append(f"{t.id} not explored: it would change {knob}, which {promoted[knob]} set in a "
                            "promotion on this lineage")
                continue
            scored.append(((proven, round(score, 6), t.explore), t, self._intervention(inp.generation, t, change,
                                                                                       sources), prior))
        scored.sort(key=lambda x: x[0], reverse=True)
        kept, notes = admissible([iv for _, _, iv, _ in scored], inp)
        notes += undo
        ids = {iv.id for iv in kept}
        ranking = ", ".join(f"{t.id} {s:.2f}{' (proven)' if p else ''}"
                            + (f" [memory: {prior.n} test(s), {prior.mean:+.3f} ± {prior.sd:.3f}]" if prior.n else "")
                            for (p, s, _), t, iv, prior in scored if iv.id in ids)
        return Plan(interventions=kept[:inp.k], author=LABEL,
                    rationale="ranked by findings, expected gain under memory's prior (1.00: a change memory knows "
                              f"nothing of) and skills: {ranking or 'nothing applicable'}"
                              + ("; " + "; ".join(notes) if notes else ""))

    @staticmethod
    def _intervention(generation: int, t, change: Change, sources: list[str]) -> Intervention:
        return Intervention(id=f"g{generation}-{t.id}", hypothesis=change.hypothesis, factor=t.factor,
                            change=change.change, target_files=sorted(change.files), expected=change.expected,
                            transform=t.id, sources=sources)

    def code(self, inp: CodeInput) -> CodeResult:
        """The transform's edit as whole files. Deterministic: a repair round cannot change it, so a failing
        transform fails the same way and the candidate is rejected with the validation error."""
        return catalog_edits(inp, LABEL)

    def critique(self, inp: CritiqueInput) -> Verdict:
        """The promotion rule's verdict as it stands: the offline Critic is the rule."""
        return inp.verdict

    def revision(self, inp: ReviseInput) -> Change:
        """Diagnostics revision: a divergence gate on the component whose reward rose without dev."""
        return divergence_gate_change(inp.culprit)
