"""What any Planner may propose: the one filter both meta-policies put their plan through.

An intervention is dropped when its factor was already tried on this champion commit (`PlanInput.tried`, where
the loop leaves out a factor whose one test there was inconclusive with a positive estimate: it may be tested again),
when an earlier one of the same plan changes the same factor (single-factor candidates: one per factor and
generation), or when skill memory records the same change as negative under the same diagnosis (blocked by a gate,
or measured harmful; an inconclusive skill is neither a reason to repeat a change nor one to avoid it). The Planner's
ranking, offline or LLM, decides the order; this filter only removes, and the plan is cut to K after it.
"""

from __future__ import annotations

from evotrainer.agents.schemas import Intervention, PlanInput
from evotrainer.memory.skill import Skill
from evotrainer.memory.store import Hit


def fired_analyzers(inp: PlanInput) -> set[str]:
    """The analyzers behind this diagnosis: those with a warning or critical finding."""
    return {f.analyzer for f in inp.findings if f.severity != "info"}


def same_diagnosis(hit: Hit, inp: PlanInput) -> bool:
    """Whether a retrieved skill was learned under this diagnosis: every analyzer its trigger names fires now (a
    skill's trigger holds the findings its candidate answered, a part of that generation's: graph/lessons.py), or
    retrieval scored its trigger at least as close as memory's merge threshold (`PlanInput.same_diagnosis`)."""
    fired, named = fired_analyzers(inp), set(hit.skill.trigger.analyzers)
    return (bool(named) and named <= fired) or hit.score >= inp.same_diagnosis


def same_change(skill: Skill, factor: str, transform: str | None) -> bool:
    """Whether a skill records this change: the same catalog transform, or, for a free-form edit (no transform), a
    free-form skill on the same factor."""
    return skill.transform == transform if transform else (skill.transform is None and skill.factor == factor)


def blocking_skill(inp: PlanInput, factor: str, transform: str | None) -> Skill | None:
    """The negative skill recorded for this change under this diagnosis, if memory holds one."""
    return next((h.skill for h in inp.skills if h.skill.outcome == "negative"
                 and same_change(h.skill, factor, transform) and same_diagnosis(h, inp)), None)


def admissible(interventions: list[Intervention], inp: PlanInput) -> tuple[list[Intervention], list[str]]:
    """The interventions a plan may keep, in their order, and a note for each one dropped."""
    kept: list[Intervention] = []
    notes: list[str] = []
    for iv in interventions:
        name = iv.transform or iv.factor
        if iv.factor in inp.tried:
            notes.append(f"{name} skipped: factor {iv.factor} was already tried on this champion")
        elif iv.factor in {k.factor for k in kept}:
            notes.append(f"{name} skipped: factor {iv.factor} is already changed by an earlier intervention")
        elif (sk := blocking_skill(inp, iv.factor, iv.transform)) is not None:
            notes.append(f"{name} skipped: skill {sk.id} recorded it as negative under this diagnosis")
        else:
            kept.append(iv)
    return kept, notes
