"""Health reports: every analyzer over the evidence of one generation and branch, as JSON and Markdown."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
from pydantic import BaseModel

from evotrainer.errors import UserError
from evotrainer.files import atomic_write_text
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
            lines.append(f"- **{f.severity}**{gate} `{f.analyzer}` {f.metric} = {f.value:.3f}{thr}: {f.message}")
            if f.evidence:
                lines.append(f"  - e.g. {', '.join(f.evidence[:3])}")
        return "\n".join(lines) + "\n"


def evidence_root(path: str | Path) -> Path:
    """The evidence folder of a run or training output directory, or the folder itself."""
    path = Path(path)
    for candidate in (path / "evidence", path):
        if candidate.is_dir() and any(candidate.glob("g*/*/rollouts-*.parquet")):
            return candidate
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


def health_report(path: str | Path, generation: int | None = None, branch: str | None = None,
                  thresholds: dict[str, dict[str, float]] | None = None) -> HealthReport:
    started = time.time()
    root = evidence_root(path)
    rollouts = read_rollouts(root, generation, branch).to_pandas()
    if rollouts.empty:
        raise UserError(f"no rollouts for generation {generation} branch {branch} under {root}")
    steps = read_steps(root, generation, branch).to_pandas()
    findings = run_all(rollouts, steps, thresholds)
    return HealthReport(generation=generation, branch=branch, n_rollouts=len(rollouts),
                        n_steps=int(rollouts["step"].nunique()), summary=summarize(rollouts), findings=findings,
                        failed_gates=sorted({f.analyzer for f in findings if f.gate}),
                        seconds=round(time.time() - started, 3))


def write_report(report: HealthReport, reports_dir: str | Path) -> Path:
    """Write `health-g<G>-<branch>.json` and `.md` atomically; returns the JSON path."""
    reports_dir = Path(reports_dir)
    stem = f"health-g{report.generation if report.generation is not None else 'all'}-" \
           f"{branch_dir(report.branch) if report.branch else 'all'}"
    for suffix, text in ((".json", report.model_dump_json(indent=2)), (".md", report.markdown())):
        atomic_write_text(reports_dir / f"{stem}{suffix}", text)
    return reports_dir / f"{stem}.json"
