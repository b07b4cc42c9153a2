"""What the agents hand each other (DESIGN §7): an intervention proposed by the Planner, a verdict by the Critic.

Findings come from `trainer.diagnostics.Finding`, backtests from `trainer.backtest.BacktestResult`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class ExpectedEffect(BaseModel):
    metric: str = Field("dev_accuracy", description="the metric the change should move")
    direction: Literal["up", "down"] = "up"
    size: float = Field(0.0, ge=0.0, description="the smallest move that would confirm the hypothesis")


class Intervention(BaseModel):
    """One single-factor change to the harness, with a falsifiable hypothesis."""

    id: str
    hypothesis: str = Field(description="if we change X, Y improves because Z")
    factor: str = Field(description="the one thing changed, dotted: reward.format_weight, recipe.temperature, ...")
    change: str = Field(description="what is edited, in words")
    target_files: list[str] = Field(default_factory=list)
    expected: ExpectedEffect = Field(default_factory=ExpectedEffect)
    transform: str | None = Field(None, description="the offline catalog transform that implements it, if any")
    sources: list[str] = Field(default_factory=list, description="finding ids (analyzer:metric) and skill ids")


class Verdict(BaseModel):
    """The Critic's decision on one backtested candidate. `promote` only when the promotion rule allows it."""

    branch: str
    decision: Literal["promote", "reject", "revise"]
    reasons: list[str] = Field(default_factory=list)
    failed_gates: list[str] = Field(default_factory=list)
    effect: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    lesson: str = Field("", description="what a later generation should learn from this candidate, in one or two "
                                        "sentences")
