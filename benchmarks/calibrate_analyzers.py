"""Every built-in analyzer's metric on one slice of evidence, whether it fires or not: the healthy side of a threshold.

    python benchmarks/calibrate_analyzers.py EVIDENCE [--generation G] [--branch B] [--tag T]

EVIDENCE is a run directory, a `train --out` directory or an evidence folder. `evotrainer diagnose` shows a metric
only when its analyzer fires; calibrating a threshold needs the value on healthy runs too. An analyzer reports its
metric only in a finding, so each is run twice with its `warning`/`critical` thresholds forced to either extreme
(one of the two always fires, the metric does not depend on them); its other parameters keep their defaults. A metric
an analyzer never reports on this slice (too few samples, a column this domain lacks) is listed as `-`. An info
finding an analyzer adds at its defaults is listed too, marked `info`: some depend on the thresholds (`small_groups`'
`group_size_needed`, the smallest group that keeps its value under the warning, is named only when it fires at its
defaults, and never at a forced extreme).
"""

from __future__ import annotations

import argparse
import math

from evotrainer.base.settings import apply_offline_switches


def metrics(rollouts, steps) -> list[tuple[str, str, float | None, dict, str]]:
    """(analyzer, metric, value, default thresholds, "yes" if it fires at its defaults, "info" if only an info finding
    there, else "") for every built-in analyzer."""
    from evotrainer.trainer.diagnostics import REGISTRY

    rows = []
    for a in REGISTRY.values():
        try:
            default = a.run(rollouts, steps)
            fires = {f.metric: "yes" for f in default if f.severity != "info"}
            seen: dict[str, float] = {}
            for extreme in (-math.inf, math.inf):
                forced = {k: extreme for k in ("warning", "critical") if k in a.defaults}
                for f in a.run(rollouts, steps, forced):
                    seen.setdefault(f.metric, f.value)
            for f in default:  # info findings at the defaults: those no forced run gives too
                if f.severity == "info" and f.metric not in seen:
                    seen[f.metric], fires[f.metric] = f.value, "info"
        except (KeyError, AttributeError, ValueError, TypeError):  # a column of another domain
            rows.append((a.id, "-", None, a.defaults, ""))
            continue
        if not seen:
            rows.append((a.id, "-", None, a.defaults, ""))
        rows += [(a.id, m, v, a.defaults, fires.get(m, "")) for m, v in sorted(seen.items())]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("evidence")
    ap.add_argument("--generation", type=int)
    ap.add_argument("--branch")
    ap.add_argument("--tag", help="one writer's chunks (a short-run arm's tag)")
    args = ap.parse_args()
    apply_offline_switches()
    from evotrainer.trainer.diagnostics.report import evidence_root
    from evotrainer.trainer.evidence import read_rollouts, read_steps

    root = evidence_root(args.evidence)
    rollouts = read_rollouts(root, args.generation, args.branch, args.tag).to_pandas()
    steps = read_steps(root, args.generation, args.branch, args.tag).to_pandas()
    print(f"{len(rollouts)} rollouts, {len(steps)} steps under {root} (generation {args.generation}, branch "
          f"{args.branch}, tag {args.tag})\n")
    print("| analyzer | metric | value | default thresholds | fires |\n|---|---|---|---|---|")
    for aid, metric, value, defaults, fires in metrics(rollouts, steps):
        thr = ", ".join(f"{k} {v:g}" for k, v in defaults.items())
        print(f"| {aid} | {metric} | {'-' if value is None else f'{value:.4g}'} | {thr} | {fires} |")


if __name__ == "__main__":
    main()
