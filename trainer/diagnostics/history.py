"""Validating a new analyzer on history: would it have flagged the branches we already judged?

A new or revised analyzer (written into a harness's `diagnostics/` folder) is replayed over the stored
evidence of every candidate branch of a run, in a sandboxed child
(`python -m evotrainer.trainer.diagnostics.history SPEC.json`, working directory the harness that holds
it). Its flags are compared with the recorded verdicts: rejected branches are the known-bad ones,
promoted branches must not be flagged. Precision, recall and false alarms decide whether the analyzer
earns its place on the champion line.
"""

from __future__ import annotations

import time
from pathlib import Path

from pydantic import BaseModel, Field

from evotrainer.base.errors import UserError
from evotrainer.trainer.diagnostics import Finding


class Slice(BaseModel):
    generation: int
    branch: str
    status: str  # promoted / rejected / open


class HistorySpec(BaseModel):
    harness_dir: str
    evidence_root: str
    slices: list[Slice]
    only: list[str] | None = None  # analyzer ids to validate (default: those the harness defines)
    thresholds: dict[str, dict[str, float]] = Field(default_factory=dict)
    result_path: str


class SliceFlags(BaseModel):
    generation: int
    branch: str
    status: str
    n_rollouts: int
    flagged: bool  # a warning, a critical finding or a gate
    findings: list[Finding]


class AnalyzerValidation(BaseModel):
    analyzers: list[str]
    slices: list[SliceFlags]
    known_bad: int
    promoted: int
    flagged_bad: int
    false_alarms: int  # promoted branches it flags
    precision: float | None  # among flagged judged branches, the share that were rejected
    recall: float | None  # among rejected branches, the share it flags
    seconds: float

    def markdown(self) -> str:
        lines = [f"# Validation of {', '.join(self.analyzers)} on history", "",
                 f"precision {_f(self.precision)}, recall {_f(self.recall)} on {self.known_bad} rejected branches; "
                 f"{self.false_alarms} false alarms on {self.promoted} promoted ones.", "",
                 "| generation | branch | verdict | flagged |", "|---|---|---|---|"]
        lines += [f"| {s.generation} | {s.branch} | {s.status} | {'yes' if s.flagged else 'no'} |" for s in self.slices]
        return "\n".join(lines) + "\n"


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def score(slices: list[SliceFlags], analyzers: list[str], seconds: float = 0.0) -> AnalyzerValidation:
    bad = [s for s in slices if s.status == "rejected"]
    good = [s for s in slices if s.status == "promoted"]
    tp, fp = sum(s.flagged for s in bad), sum(s.flagged for s in good)
    return AnalyzerValidation(analyzers=analyzers, slices=slices, known_bad=len(bad), promoted=len(good),
                              flagged_bad=tp, false_alarms=fp, precision=tp / (tp + fp) if tp + fp else None,
                              recall=tp / len(bad) if bad else None, seconds=round(seconds, 3))


def validate(spec: HistorySpec) -> AnalyzerValidation:
    """Run the chosen analyzers over every slice. Imports harness code: child processes only."""
    from evotrainer.trainer.diagnostics import REGISTRY, load_harness_analyzers
    from evotrainer.trainer.evidence import read_rollouts, read_steps

    started = time.time()
    defined = load_harness_analyzers(spec.harness_dir)
    ids = spec.only or defined
    unknown = [i for i in ids if i not in REGISTRY]
    if not ids:
        raise UserError(f"{spec.harness_dir}/diagnostics registers no analyzer to validate")
    if unknown:
        raise UserError(f"no analyzer {unknown[0]!r} to validate; {spec.harness_dir}/diagnostics defines {defined}")
    out = []
    for s in spec.slices:
        rollouts = read_rollouts(spec.evidence_root, s.generation, s.branch).to_pandas()
        if rollouts.empty:
            continue
        steps = read_steps(spec.evidence_root, s.generation, s.branch).to_pandas()
        findings = [f for i in ids for f in REGISTRY[i].run(rollouts, steps, spec.thresholds.get(i))]
        out.append(SliceFlags(generation=s.generation, branch=s.branch, status=s.status, n_rollouts=len(rollouts),
                              flagged=any(f.severity != "info" or f.gate for f in findings), findings=findings))
    return score(out, ids, time.time() - started)


def validate_on_history(harness_dir: str | Path, slices: list[Slice], *, evidence: Path, thresholds: dict,
                        work: Path, only: list[str] | None = None) -> AnalyzerValidation:
    """Parent side: the analyzers of `harness_dir` over the evidence of every slice (a judged branch of a run),
    judged by the champion's `thresholds`; specs and logs under `work` (RunWorkspace.validate_analyzers)."""
    from evotrainer.trainer import jobs
    from evotrainer.trainer.sandbox import Limits

    harness_dir = Path(harness_dir).resolve()
    if not any((harness_dir / "diagnostics").glob("*.py")):
        raise UserError(f"{harness_dir} has no diagnostics/*.py: put the analyzer to validate there")
    if not any(s.status != "open" for s in slices):
        raise UserError(f"run {work} has no judged branches yet: nothing to validate an analyzer against")
    spec = HistorySpec(harness_dir=str(harness_dir), evidence_root=str(evidence), slices=slices, only=only,
                       thresholds=thresholds, result_path="")
    return jobs.call_child("evotrainer.trainer.diagnostics.history", spec, AnalyzerValidation, work=work,
                           name="history", cwd=harness_dir, limits=Limits.by_cpu(1200, memory_mb=8000),
                           label=f"validation of the analyzers in {harness_dir}",
                           read=[str(harness_dir), str(evidence)])


if __name__ == "__main__":  # `python -m evotrainer.trainer.diagnostics.history SPEC.json` (validate_on_history)
    from evotrainer.trainer.sandbox import serve_spec

    serve_spec(HistorySpec, validate)
