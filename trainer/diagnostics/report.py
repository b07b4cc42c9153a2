"""Health reports: every analyzer over the evidence of one generation and branch, as JSON and Markdown.

Built-in analyzers are package code and always run in the calling process. When the harness carries its
own analyzers (`diagnostics/*.py`), those alone run in an isolated child whose working directory is the
harness (`python -m evotrainer.trainer.diagnostics.report SPEC.json`), and their findings join the report:
harness code can add a finding, never remove or change a built-in one.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pandas as pd
from pydantic import BaseModel

from evotrainer.base.errors import UserError
from evotrainer.base.files import atomic_write_text
from evotrainer.trainer.diagnostics import Finding, run_all
from evotrainer.trainer.evidence import branch_dir, read_rollouts, read_steps


class HealthReport(BaseModel):
    generation: int | None
    branch: str | None
    n_rollouts: int
    n_steps: int
    summary: dict[str, float]
    findings: list[Finding]
    failed_gates: list[str]
    seconds: float

    def markdown(self) -> str:
        where = f"generation {self.generation if self.generation is not None else 'all'}, " \
                f"branch {self.branch or 'all'}"
        lines = [f"# Health report ({where})", "",
                 f"{self.n_rollouts} rollouts over {self.n_steps} steps.", "", "| metric | value |", "|---|---|"]
        lines += [f"| {k} | {v:.3f} |" for k, v in self.summary.items()]
        lines += ["", "## Findings", ""]
        if not self.findings:
            lines.append("No analyzer fired.")
        for f in sorted(self.findings, key=lambda f: ("critical", "warning", "info").index(f.severity)):
            gate = " **GATE**" if f.gate else ""
            thr = f" (threshold {f.threshold:g})" if f.threshold is not None else ""
            lines.append(f"- **{f.severity}**{gate} `{f.analyzer}` {f.metric} = {f.value:.3g}{thr}: {f.message}")
            if f.evidence:
                lines.append(f"  - e.g. {', '.join(f.evidence[:3])}")
        return "\n".join(lines) + "\n"


def evidence_root(path: str | Path) -> Path:
    """The evidence folder of a run or training output directory, or the folder itself."""
    path = Path(path)
    for candidate in (path / "evidence", path):
        if candidate.is_dir() and any(candidate.glob("g*/*/rollouts-*.parquet")):
            return candidate
    if any(path.glob("rollouts-*.parquet")) and re.fullmatch(r"g\d+", path.parent.name):  # one slice of it
        run = path.parent.parent.parent
        raise UserError(f"{path} is one slice of the evidence under {path.parent.parent}: diagnose it with "
                        f"`evotrainer diagnose {run} --generation {path.parent.name[1:]} --branch {path.name}`")
    raise UserError(f"no rollout evidence under {path}: pass a run directory, a `train --out` directory or "
                    "its evidence/ folder")


def summarize(r: pd.DataFrame) -> dict[str, float]:
    g = r.groupby("group_id")["reward"].std(ddof=0)
    out = {"reward_mean": float(r["reward"].mean()), "correct_rate": float(r["correct"].mean()),
           "dead_group_ratio": float((g < 1e-6).mean()), "truncated_ratio": float(r["truncated"].mean()),
           "mean_tokens": float(r["n_tokens"].mean()), "mean_logprob": float(r["mean_logprob"].mean())}
    if "formatted" in r:
        out["format_failure_ratio"] = float(1 - r["formatted"].mean())
    return out


class AnalyzeSpec(BaseModel):
    """What the report child needs; written to JSON by the parent."""

    evidence_root: str
    generation: int | None = None
    branch: str | None = None
    tag: str | list[str] | None = None  # writer tags: a prefix, or the exact tags of a short run's arms
    harness_dir: str | None = None  # its diagnostics/*.py are imported and run alone (child only)
    thresholds: dict[str, dict[str, float]] = {}
    result_path: str


def analyze(spec: AnalyzeSpec) -> HealthReport:
    """The analyzers over one evidence slice, in this process: the built-in ones, or, with `spec.harness_dir`
    (an isolated child), only the harness's own."""
    from evotrainer.trainer.diagnostics import load_harness_analyzers

    started = time.time()
    own = None
    if spec.harness_dir:
        try:
            own = load_harness_analyzers(spec.harness_dir)
        except Exception as e:
            raise UserError(f"the harness's own analyzers failed to load: {type(e).__name__}: {e}") from e
    rollouts = read_rollouts(spec.evidence_root, spec.generation, spec.branch, spec.tag).to_pandas()
    if rollouts.empty:
        raise UserError(f"no rollouts for generation {spec.generation} branch {spec.branch} under "
                        f"{spec.evidence_root}")
    steps = read_steps(spec.evidence_root, spec.generation, spec.branch, spec.tag).to_pandas()
    findings = run_all(rollouts, steps, spec.thresholds, only=own) if own != [] else []
    return HealthReport(generation=spec.generation, branch=spec.branch, n_rollouts=len(rollouts),
                        n_steps=int(rollouts["step"].nunique()), summary=summarize(rollouts), findings=findings,
                        failed_gates=sorted({f.analyzer for f in findings if f.gate}),
                        seconds=round(time.time() - started, 3))


def has_own_analyzers(harness_dir: str | Path | None) -> bool:
    return bool(harness_dir) and any((Path(harness_dir) / "diagnostics").glob("*.py"))


def health_report(path: str | Path, generation: int | None = None, branch: str | None = None,
                  harness_dir: str | Path | None = None, work_dir: str | Path | None = None, *,
                  tag: str | list[str] | None = None, thresholds: dict[str, dict[str, float]] | None = None
                  ) -> HealthReport:
    """The health report of an evidence slice, with the own analyzers of `harness_dir` and its thresholds
    (or `thresholds`, e.g. the champion's when a candidate is judged)."""
    from evotrainer.trainer.harness import load_spec

    root = evidence_root(path)
    if thresholds is None:
        thresholds = load_spec(harness_dir).analyzers if harness_dir else {}
    spec = AnalyzeSpec(evidence_root=str(root), generation=generation, branch=branch, tag=tag,
                       thresholds=thresholds, result_path="")
    report = analyze(spec)  # the built-in analyzers: package code, in this process
    if not has_own_analyzers(harness_dir):
        return report
    from evotrainer.trainer import jobs
    from evotrainer.trainer.sandbox import Limits

    harness_dir = Path(harness_dir).resolve()
    name = f"report-g{generation if generation is not None else 'all'}-{branch_dir(branch) if branch else 'all'}"
    child = spec.model_copy(update={"harness_dir": str(harness_dir)})
    own = jobs.call_child("evotrainer.trainer.diagnostics.report", child, HealthReport,
                          work=Path(work_dir or root.parent), name=name, cwd=harness_dir,
                          limits=Limits.by_cpu(600, memory_mb=8000),
                          label="health report with the harness's own analyzers", read=[str(harness_dir), str(root)])
    findings = report.findings + own.findings
    return report.model_copy(update={"findings": findings, "failed_gates": sorted({f.analyzer for f in findings
                                                                                   if f.gate}),
                                     "seconds": round(report.seconds + own.seconds, 3)})


def write_report(report: HealthReport, reports_dir: str | Path) -> Path:
    """Write `health-g<G>-<branch>.json` and `.md` atomically; returns the JSON path."""
    reports_dir = Path(reports_dir)
    stem = f"health-g{report.generation if report.generation is not None else 'all'}-" \
           f"{branch_dir(report.branch) if report.branch else 'all'}"
    for suffix, text in ((".json", report.model_dump_json(indent=2)), (".md", report.markdown())):
        atomic_write_text(reports_dir / f"{stem}{suffix}", text)
    return reports_dir / f"{stem}.json"


if __name__ == "__main__":  # `python -m evotrainer.trainer.diagnostics.report SPEC.json` (health_report)
    from evotrainer.trainer.sandbox import serve_spec

    serve_spec(AnalyzeSpec, analyze)
