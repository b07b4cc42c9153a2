"""Rollout-level analyzers: what a scalar reward hides, as Findings that cite rollout ids (DESIGN §7).

An analyzer is a function `(rollouts, steps, thresholds) -> list[Finding]` over the evidence
tables (pandas DataFrames with the columns of `trainer/evidence.py`), registered with `@analyzer`
under a stable id, a one-paragraph doc (its docstring) and default thresholds. A harness overrides
thresholds in `harness.yaml` under `analyzers: {<id>: {<name>: value}}`. Analyzers are vectorised:
they read whole columns, never loop over rows in Python.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import pandas as pd
from pydantic import BaseModel, Field

Severity = Literal["info", "warning", "critical"]


class Finding(BaseModel):
    analyzer: str
    metric: str
    value: float
    threshold: float | None = None
    severity: Severity
    gate: bool = False  # a failed gate vetoes promotion
    message: str
    evidence: list[str] = Field(default_factory=list, description="rollout ids that show it (at most 20)")


@dataclass(frozen=True)
class Analyzer:
    id: str
    fn: Callable[[pd.DataFrame, pd.DataFrame, dict[str, float]], list[Finding]]
    defaults: dict[str, float]

    @property
    def doc(self) -> str:
        return " ".join((self.fn.__doc__ or "").split())

    def run(self, rollouts: pd.DataFrame, steps: pd.DataFrame, overrides: dict[str, float] | None = None
            ) -> list[Finding]:
        return self.fn(rollouts, steps, {**self.defaults, **(overrides or {})})


REGISTRY: dict[str, Analyzer] = {}


def analyzer(id: str, **defaults: float):
    """Register a built-in analyzer under `id` with its default thresholds."""
    def wrap(fn):
        REGISTRY[id] = Analyzer(id, fn, defaults)
        return fn
    return wrap


def run_all(rollouts: pd.DataFrame, steps: pd.DataFrame, thresholds: dict[str, dict[str, float]] | None = None,
            only: list[str] | None = None) -> list[Finding]:
    """Every registered analyzer (or those in `only`) over one slice of evidence."""
    thresholds = thresholds or {}
    findings: list[Finding] = []
    if rollouts.empty:
        return findings
    for a in REGISTRY.values():
        if only is None or a.id in only:
            findings.extend(a.run(rollouts, steps, thresholds.get(a.id)))
    return findings


from evotrainer.trainer.diagnostics import builtin  # noqa: E402, F401  (registers the built-ins)
