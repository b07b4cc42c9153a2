"""Rollout-level analyzers: what a scalar reward hides, as Findings that cite rollout ids (DESIGN §7).

An analyzer is a function `(rollouts, steps, thresholds) -> list[Finding]` over the evidence
tables (pandas DataFrames with the columns of `trainer/evidence.py`), registered with `@analyzer`
under a stable id, a one-paragraph doc (its docstring) and default thresholds. A harness overrides
thresholds in `harness.yaml` under `analyzers: {<id>: {<name>: value}}`. Analyzers are vectorised:
they read whole columns, never loop over rows in Python.

A harness may carry its own analyzers in `diagnostics/*.py`, written the same way (import `analyzer`
and `Finding` from this module). They are harness code: `load_harness_analyzers` imports them only in
child processes (a health report or a replay run in the sandbox), never in the orchestrator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
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
        old = REGISTRY.get(id)
        if old is not None and (old.fn.__module__, old.fn.__qualname__) != (fn.__module__, fn.__qualname__):
            raise ValueError(f"analyzer id {id!r} is already registered by {old.fn.__module__}; choose another id")
        REGISTRY[id] = Analyzer(id, fn, defaults)
        return fn
    return wrap


def load_harness_analyzers(harness_dir: str | Path) -> list[str]:
    """Import a harness's `diagnostics/*.py` and return the analyzer ids they registered. Child processes only."""
    from evotrainer.trainer.harness import import_file

    before = set(REGISTRY)
    for path in sorted((Path(harness_dir) / "diagnostics").glob("*.py")):
        import_file(path, f"harness_diagnostics_{path.stem}")
    return sorted(set(REGISTRY) - before)


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


from evotrainer.trainer.diagnostics import builtin, code, swe  # noqa: E402, F401  (registers the built-ins)
