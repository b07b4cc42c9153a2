"""Distillation: turn a judged candidate into a skill, or into more evidence for a skill already known.

A lesson is identified by its factor and its trigger: a new verdict whose intervention changes the same
factor (and the same catalog transform, when both have one) after a diagnosis similar to a stored skill's
trigger is merged into that skill: its backtest joins the validations, the effects combine by inverse
variance, the outcome and `general` are recomputed. Distilling the same backtest twice (a resumed run)
adds nothing. Otherwise a new skill is written. Negative lessons are kept like positive ones: they stop a
later Planner from repeating a change that failed or was blocked by a gate.
"""

from __future__ import annotations

from evotrainer.agents.schemas import Intervention, Verdict
from evotrainer.memory.skill import Skill, Trigger, Validation
from evotrainer.memory.store import SkillStore
from evotrainer.trainer.backtest import BacktestResult
from evotrainer.trainer.diagnostics import Finding

# cosine similarity of two trigger texts above which they describe the same situation: the same analyzer
# message with other numbers scores above it, different situations with the same factor below (tests/test_memory.py)
MERGE_SIMILARITY = {"minilm": 0.75, "hashing": 0.60}
_SEVERE = {"warning", "critical"}


def trigger_of(findings: list[Finding], diagnosis: str = "") -> Trigger:
    """The diagnostic signature: the warning and critical findings, and the diagnosis text (or their messages)."""
    severe = [f for f in findings if f.severity in _SEVERE] or findings
    text = diagnosis.strip() or "; ".join(f.message for f in severe) or "no finding"
    return Trigger(text=text, analyzers=sorted({f.analyzer for f in severe}),
                   signature=", ".join(f"{f.analyzer}:{f.severity}={f.value:.3g}" for f in severe))


def validation_of(verdict: Verdict, domain: str, backtest: BacktestResult | None = None, *, run: str = "",
                  generation: int = 0, commit: str = "") -> Validation:
    s = backtest.short_run if backtest else None
    gates = sorted(set(verdict.failed_gates) | set(backtest.failed_gates if backtest else []))
    return Validation(domain=domain, verdict=verdict.decision, failed_gates=gates, repairs=verdict.repairs,
                      effect=s.delta if s else verdict.effect, ci_low=s.ci_low if s else verdict.ci_low,
                      ci_high=s.ci_high if s else verdict.ci_high, seeds=len(s.seeds) if s else 0,
                      steps=s.steps if s else 0, dev_items=s.dev_items if s else 0,
                      run=run or (backtest.run if backtest else ""),
                      generation=backtest.generation if backtest else generation, branch=verdict.branch,
                      commit=commit or (backtest.commit if backtest else ""))


def _lesson(intervention: Intervention, v: Validation) -> str:
    if v.failed_gates:
        return f"{intervention.change}: blocked by {', '.join(v.failed_gates)} in {v.domain}."
    if v.effect is None:
        return f"{intervention.change}: {v.verdict} in {v.domain}, not measured on dev."
    if v.repairs:
        return (f"{intervention.change}: repairs {', '.join(v.repairs)} that the champion failed; dev {v.effect:+.3f} "
                f"[{v.ci_low:+.3f}, {v.ci_high:+.3f}] against the gated champion over {v.seeds} seeds x {v.steps} "
                f"steps in {v.domain} ({v.verdict}).")
    return (f"{intervention.change}: dev {v.effect:+.3f} [{v.ci_low:+.3f}, {v.ci_high:+.3f}] over {v.seeds} seeds x "
            f"{v.steps} steps in {v.domain} ({v.verdict}).")


def find_duplicate(store: SkillStore, trigger: Trigger, factor: str, transform: str | None) -> Skill | None:
    """The stored skill this lesson repeats, if any: same factor, compatible transform, and a similar trigger:
    the same set of analyzers behind it, or a trigger text closer than MERGE_SIMILARITY."""
    for hit in store.query(trigger.text, k=10, factor=factor, record=False):
        same_transform = not (transform and hit.skill.transform) or transform == hit.skill.transform
        same_signature = bool(trigger.analyzers) and set(trigger.analyzers) == set(hit.skill.trigger.analyzers)
        if same_transform and (same_signature or hit.score >= MERGE_SIMILARITY[store.embedding]):
            return hit.skill
    return None


def distill(store: SkillStore, intervention: Intervention, verdict: Verdict, domain: str, *,
            findings: list[Finding] = (), diagnosis: str = "", backtest: BacktestResult | None = None,
            run: str = "", generation: int = 0, commit: str = "") -> tuple[Skill, bool]:
    """Record what this candidate taught. Returns the skill and whether it was merged into an existing one."""
    trigger = trigger_of(list(findings), diagnosis)
    validation = validation_of(verdict, domain, backtest, run=run, generation=generation, commit=commit)
    lesson = verdict.lesson.strip() or _lesson(intervention, validation)
    skill = find_duplicate(store, trigger, intervention.factor, intervention.transform)
    merged = skill is not None
    if skill is None:
        skill = Skill(trigger=trigger, factor=intervention.factor, intervention=intervention.change,
                      transform=intervention.transform, lesson=lesson,
                      expected=f"{intervention.expected.metric} {intervention.expected.direction} by at least "
                               f"{intervention.expected.size:g}")
    key = (validation.run, validation.branch, validation.commit)
    if not validation.commit or not any((v.run, v.branch, v.commit) == key for v in skill.validations):
        skill.validations.append(validation)
        skill.transform = skill.transform or intervention.transform
        skill.trigger.analyzers = sorted(set(skill.trigger.analyzers) | set(trigger.analyzers))
        skill.lesson = lesson
    skill.recompute()
    store.put(skill)
    return skill, merged
