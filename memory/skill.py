"""The skill record (DESIGN §7): a distilled lesson, positive or negative, with the evidence behind it.

A skill says: when the diagnosis looks like `trigger`, changing `factor` by `intervention` did (positive) or
did not (negative: blocked by a gate, or measured harmful) help, or was not resolved (inconclusive), by `effect`
on sealed dev, in these `domains`. Every backtest that taught it is kept
in `validations`; the combined effect, the outcome and `general` are recomputed from them (`recompute`), so
that merged evidence can overturn an early lesson.
"""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, Field

SkillOutcome = Literal["positive", "negative", "inconclusive"]
Z95 = 1.959964


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class Trigger(BaseModel):
    """The diagnostic signature that called for the intervention."""

    text: str = Field(description="the diagnosis in words; this is what retrieval embeds")
    analyzers: list[str] = Field(default_factory=list, description="ids of the findings behind it, sorted")
    signature: str = Field("", description="analyzer:severity=value, ...: the findings in short")


class Validation(BaseModel):
    """One backtest of the intervention: where, how, and what it showed."""

    domain: str
    verdict: Literal["promote", "reject", "inconclusive", "revise"]
    effect: float | None = Field(None, description="paired dev difference, candidate minus control")
    ci_low: float | None = None
    ci_high: float | None = None
    seeds: int = 0
    steps: int = 0
    dev_items: int = 0
    failed_gates: list[str] = Field(default_factory=list)
    repairs: list[str] = Field(default_factory=list, description="gates the champion failed that this candidate "
                                                                 "repaired (its verdict's)")
    run: str = ""
    generation: int = 0
    branch: str = ""
    commit: str = ""
    at: str = Field(default_factory=_now)

    @property
    def se(self) -> float | None:
        if self.ci_low is None or self.ci_high is None:
            return None
        return (self.ci_high - self.ci_low) / (2 * Z95)

    @property
    def held(self) -> bool:
        """Positive evidence: promoted (a gain, or the repair of a gate the champion failed), or a clean
        significant gain."""
        return self.verdict == "promote" or (not self.failed_gates and self.ci_low is not None and self.ci_low > 0)


def _pooled(validations: list[Validation]) -> tuple[float, float] | None:
    """The inverse-variance mean of the measured effects and its 95% half-width; None when none was measured."""
    measured = [(v.effect, v.se) for v in validations if v.effect is not None and v.se]
    if not measured:
        return None
    weights = [1 / se ** 2 for _, se in measured]
    return sum(w * e for w, (e, _) in zip(weights, measured)) / sum(weights), Z95 / math.sqrt(sum(weights))


class Skill(BaseModel):
    id: str = Field(default_factory=lambda: "sk-" + uuid.uuid4().hex[:12])
    trigger: Trigger
    factor: str
    intervention: str = Field(description="the change, in words")
    transform: str | None = Field(None, description="the offline catalog transform that re-applies it")
    expected: str = Field("", description="the expected outcome: metric, direction, size")
    lesson: str = ""
    outcome: SkillOutcome = "negative"
    effect: float | None = Field(None, description="inverse-variance combination of the validations' effects")
    ci_low: float | None = None
    ci_high: float | None = None
    domains: list[str] = Field(default_factory=list, description="domains where the outcome held")
    general: bool = Field(False, description="positive in two or more domains")
    validations: list[Validation] = Field(default_factory=list)
    retrieved: int = 0
    used: int = Field(0, description="times a Planner used it in a plan")
    outcomes_after_use: list[SkillOutcome] = Field(default_factory=list)
    created: str = Field(default_factory=_now)
    updated: str = Field(default_factory=_now)

    def recompute(self) -> Skill:
        """Combined effect, outcome, domains and `general` from the validations."""
        pooled = _pooled(self.validations)
        if pooled:
            self.effect, half = pooled
            self.ci_low, self.ci_high = self.effect - half, self.effect + half
        else:
            self.effect = next((v.effect for v in self.validations if v.effect is not None), None)
            self.ci_low = self.ci_high = None
        gated = any(v.failed_gates for v in self.validations)
        # a promoted repair is positive even at a dev cost (the effect records that cost): validity before score
        repaired = any(v.repairs and v.verdict == "promote" for v in self.validations)
        positive = not gated and (repaired or (self.ci_low > 0 if self.ci_low is not None
                                               else any(v.held for v in self.validations)))
        # negative: blocked by a gate, or measured harmful (the combined interval below zero, or every test rejected:
        # the Critic rejects without a gate only what it measured harmful); anything else unresolved is
        # inconclusive, not a lesson against the change. A repair's test does not count toward harm: its dev effect
        # is against a champion that fails a gate, whose score is not one to beat, and rejected it is still the one
        # change that passed that gate (a negative lesson would keep it out of every later plan for the same finding)
        judged = [v for v in self.validations if not v.repairs]
        plain = _pooled(judged)
        harmful = (plain is not None and plain[0] + plain[1] < 0) or \
            (bool(judged) and all(v.verdict == "reject" for v in judged))
        self.outcome = "positive" if positive else "negative" if gated or harmful else "inconclusive"
        agree = [v.domain for v in self.validations if v.held == positive]
        self.domains = sorted(set(agree or [v.domain for v in self.validations]))
        self.general = positive and len({v.domain for v in self.validations if v.held}) >= 2
        self.updated = _now()
        return self

    def document(self) -> str:
        """The text that is embedded: what a later diagnosis will resemble."""
        return self.trigger.text

    def summary(self) -> str:
        eff = "n/a" if self.effect is None else f"{self.effect:+.3f}"
        return f"{self.outcome} {self.factor}: {self.intervention} (effect {eff}, {len(self.validations)} backtests)"
