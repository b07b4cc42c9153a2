"""Would a backtest decide with more power on sampled accuracy (avg@k) than on greedy accuracy? Issue #24 asks a
minimum detectable effect of 0.015; one seed of short runs gives 0.023-0.037 on greedy sealed dev.

    python benchmarks/decision_metric.py

From the committed comparisons (docs/results/{math,code,code-w3}/ and docs/results/repair/*/: every arm's cells keep,
per sealed test item, its greedy outcome and its k sampled outcomes), for every arm against the reference on the
same 3 seeds and items: the paired effect under each metric, its item-level standard error (one seed's bootstrap),
the between-seed spread beyond it (method of moments, as `seed_spread.py`), and the z-score a one-seed decision would
have (effect over the root of the two variances added). The backtest's power is the z-score: a metric whose item
error is smaller but whose effects shrink as much gains nothing. Arms identical to the reference on every item
(a loop that promoted nothing) are left out.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from evotrainer.compare.results import cells_on_record

ROOT = Path(__file__).resolve().parent.parent / "docs" / "results"


def effect(cells: dict, arm: str, seeds: list[int], metric: str) -> tuple[float, float, float]:
    """(mean paired effect, item-level standard error, between-seed spread) of `arm` minus the reference."""
    per_seed, item_var = [], []
    for s in seeds:
        a, r = cells[(arm, s)], cells[("reference", s)]
        if metric == "greedy":
            x = np.array(a["greedy_correct"], float) - np.array(r["greedy_correct"], float)
        else:
            x = np.array(a["sampled_correct"], float) / a["k"] - np.array(r["sampled_correct"], float) / r["k"]
        per_seed.append(x.mean())
        item_var.append(x.var(ddof=1) / len(x))
    tau2 = max(float(np.var(per_seed, ddof=1)) - float(np.mean(item_var)), 0.0)
    return float(np.mean(per_seed)), math.sqrt(float(np.mean(item_var))), math.sqrt(tau2)


def main() -> None:
    repair = sorted(p for p in (ROOT / "repair").iterdir() if p.is_dir())
    dirs = [ROOT / "math", ROOT / "code", ROOT / "code-w3", *repair]
    rows = []
    for d in dirs:
        cells = {key: c for key, c in cells_on_record(d / "cells").items() if c.get("k") and c.get("sampled_correct")}
        for arm in sorted({a for a, _ in cells} - {"reference"}):
            seeds = sorted(s for a, s in cells if a == arm and ("reference", s) in cells)
            same = all(cells[(arm, s)]["greedy_correct"] == cells[("reference", s)]["greedy_correct"] for s in seeds)
            if len(seeds) < 3 or same:
                continue
            g, a = effect(cells, arm, seeds, "greedy"), effect(cells, arm, seeds, "avg")
            zg, za = g[0] / math.hypot(g[1], g[2]), a[0] / math.hypot(a[1], a[2])
            rows.append((f"{d.relative_to(ROOT)} {arm}", g, a, zg, za))
    print("| comparison | greedy effect | item SE | seed spread | one-seed z | avg@k effect | item SE | seed spread | "
          "one-seed z |\n|---|---|---|---|---|---|---|---|---|")
    for name, g, a, zg, za in rows:
        print(f"| {name} | {g[0]:+.3f} | {g[1]:.4f} | {g[2]:.4f} | {zg:+.2f} | {a[0]:+.3f} | {a[1]:.4f} | {a[2]:.4f} | "
              f"{za:+.2f} |")
    item = np.median([a[1] / g[1] for _, g, a, _, _ in rows])
    spread = [(g[2], a[2]) for _, g, a, _, _ in rows]
    stronger = sum(abs(za) > abs(zg) for *_, zg, za in rows)
    print(f"\n{len(rows)} comparisons: avg@k's item error is {item:.2f}x greedy's (median ratio); root mean square "
          f"seed spread {math.sqrt(np.mean([s[0] ** 2 for s in spread])):.4f} greedy, "
          f"{math.sqrt(np.mean([s[1] ** 2 for s in spread])):.4f} avg@k; the one-seed z-score is larger under avg@k "
          f"in {stronger} of {len(rows)}, median |z| {np.median([abs(r[3]) for r in rows]):.2f} greedy, "
          f"{np.median([abs(r[4]) for r in rows]):.2f} avg@k.")


if __name__ == "__main__":
    main()
