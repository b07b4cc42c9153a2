"""Distillation: turn a lesson into a skill, or into more evidence for a skill already known.

A lesson is identified by its factor and its trigger: a new lesson that changes the same factor (and the same
catalog transform, when both have one) after a diagnosis similar to a stored skill's trigger is merged into that
skill: its validation joins the others, the effects combine by inverse variance, the outcome and `general` are
recomputed. Distilling the same backtest twice (a resumed run) adds nothing. Otherwise a new skill is written.
Negative lessons are kept like positive ones: they stop a later Planner from repeating a change that failed or
was blocked by a gate.

Memory knows skills, triggers and validations only: what a Critic's verdict and a backtest mean as a lesson is
decided by the loop's distill node (`graph/lessons.py`), which hands a `Lesson` here.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from evotrainer.memory.skill import Skill, Trigger, Validation
from evotrainer.memory.store import SkillStore
from evotrainer.trainer.diagnostics import Finding

# cosine similarity of two trigger texts above which they describe the same situation: the same analyzer
# message with other numbers scores above it, different situations with the same factor below (tests/test_memory.py)
MERGE_SIMILARITY = {"minilm": 0.75, "hashing": 0.60}
_SEVERE = {"warning", "critical"}


class Lesson(BaseModel):
    """What one judged candidate taught, in memory's terms."""

    trigger: Trigger
    factor: str
    change: str = Field(description="the intervention in words")
    transform: str | None = None
    expected: str = Field("", description="the hypothesised effect in words")
    validation: Validation
    text: str = Field(description="the lesson, one or two sentences")


def trigger_of(findings: list[Finding], diagnosis: str = "") -> Trigger:
    """The diagnostic signature: the warning and critical findings, and the diagnosis text (or their messages)."""
    severe = [f for f in findings if f.severity in _SEVERE] or findings
    text = diagnosis.strip() or "; ".join(f.message for f in severe) or "no finding"
    return Trigger(text=text, analyzers=sorted({f.analyzer for f in severe}),
                   signature=", ".join(f"{f.analyzer}:{f.severity}={f.value:.3g}" for f in severe))


def find_duplicate(store: SkillStore, trigger: Trigger, factor: str, transform: str | None) -> Skill | None:
    """The stored skill this lesson repeats, if any: same factor, compatible transform, and a similar trigger:
    the same set of analyzers behind it, or a trigger text closer than MERGE_SIMILARITY."""
    for hit in store.query(trigger.text, k=10, factor=factor, record=False):
        same_transform = not (transform and hit.skill.transform) or transform == hit.skill.transform
        same_signature = bool(trigger.analyzers) and set(trigger.analyzers) == set(hit.skill.trigger.analyzers)
        if same_transform and (same_signature or hit.score >= MERGE_SIMILARITY[store.embedding]):
            return hit.skill
    return None


def distill(store: SkillStore, lesson: Lesson) -> tuple[Skill, bool]:
    """Record a lesson. Returns the skill and whether it was merged into an existing one."""
    trigger, validation = lesson.trigger, lesson.validation
    skill = find_duplicate(store, trigger, lesson.factor, lesson.transform)
    merged = skill is not None
    if skill is None:
        skill = Skill(trigger=trigger, factor=lesson.factor, intervention=lesson.change, transform=lesson.transform,
                      lesson=lesson.text, expected=lesson.expected)
    key = (validation.run, validation.branch, validation.commit)
    if not validation.commit or not any((v.run, v.branch, v.commit) == key for v in skill.validations):
        skill.validations.append(validation)
        skill.transform = skill.transform or lesson.transform
        skill.trigger.analyzers = sorted(set(skill.trigger.analyzers) | set(trigger.analyzers))
        skill.lesson = lesson.text
    skill.recompute()
    store.put(skill)
    return skill, merged
