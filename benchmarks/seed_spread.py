"""The between-seed spread of a paired recipe effect that one seed's bootstrap cannot see (`BacktestConfig.seed_sd`),
and what it means for the power of a decision.

    python benchmarks/seed_spread.py

Per recipe, from committed comparisons (each static recipe minus the reference on the same 3 seeds and sealed test
items): the variance of its per-seed paired effects minus the mean item-level variance (method of moments), then
the root mean square over recipes.
- wave 1 (docs/results/wave1/<domain>/compare.json, 20 steps): the figure `seed_sd` is set from. Printed
  2026-12-05: 0.0060 (per recipe 0.0000-0.0083).
- wave 2 (docs/results/{math,code,code-w3}/cells/, the default budget's 60-80 steps): the same measure at the
  comparison's horizon. Printed 2026-12-07: 0.0078 (per recipe 0.0000-0.0125).

Then the floor that spread puts under a decision's minimum detectable effect (MDE = 2.8 x its standard error, the
two-sided 5% test at 80% power, `statistics.Z_POWER`): n seeds of one candidate against its control, each scored on
the whole dev split (as large as the test split, so the test's item-level error stands for it), have an error of
sqrt((item_se^2 + seed_sd^2) / n); and the GRPO steps that costs a seed, against the reference's, at the default
budget (3 generations of 20-step segments; a candidate's n arms and the control's n - 1 beyond the one that is the
main line's next segment; nothing promoted).
"""

import json
import math
from pathlib import Path

import numpy as np

from evotrainer.compare.results import cells_on_record
from evotrainer.trainer.backtest.statistics import Z_POWER

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"
STATIC = ("dr_grpo", "zero_var", "clip_higher")


def spread(cells: dict, label: str) -> tuple[list[float], list[float]]:
    """Per recipe of `cells` ((arm, seed) -> cell): its seed spread, and its paired item-level standard error."""
    taus, ses = [], []
    for arm in STATIC:
        if (arm, 0) not in cells:
            continue
        d, se2 = [], []
        for s in (0, 1, 2):
            g = np.array(cells[(arm, s)]["greedy_correct"], float) - np.array(cells[("reference", s)]["greedy_correct"],
                                                                              float)
            d.append(g.mean())
            se2.append(g.var(ddof=1) / len(g))
        tau = math.sqrt(max(np.var(d, ddof=1) - np.mean(se2), 0.0))
        taus.append(tau)
        ses.append(math.sqrt(np.mean(se2)))
        print(f"{label} {arm}: per-seed effects {np.round(d, 3).tolist()}, seed spread {tau:.4f}, "
              f"item-level error {ses[-1]:.4f}")
    return taus, ses


def rms(xs: list[float]) -> float:
    return math.sqrt(np.mean(np.square(xs)))


print("wave 1 (20 steps):")
wave1 = []
for domain in ("math", "code"):
    report = json.loads((RESULTS / "wave1" / domain / "compare.json").read_text())
    wave1 += spread({(c["arm"], c["seed"]): c for c in report["cells"]}, domain)[0]
print(f"root mean square over recipes: {rms(wave1):.4f}")

print("wave 2 (the default budget, 60-80 steps):")
wave2, item = [], {}
for domain in ("math", "code", "code-w3"):
    taus, ses = spread(cells_on_record(RESULTS / domain / "cells"), domain)
    wave2 += taus
    item.setdefault(domain.split("-")[0], []).extend(ses)
print(f"root mean square over recipes: {rms(wave2):.4f}")

print("the MDE of a decision on n seeds, and its steps a seed against the reference's (60):")
for domain, ses in item.items():
    se_item = rms(ses)
    for seed_sd in (rms(wave1), rms(wave2)):
        row = []
        for n in (1, 2, 3, 4, 5):
            mde = Z_POWER * math.sqrt((se_item ** 2 + seed_sd ** 2) / n)
            steps = 3 * (20 + 20 * n + 20 * (n - 1))
            row.append(f"n={n}: {mde:.3f} at {steps / 60:.1f}x")
        print(f"{domain} (item-level error {se_item:.4f}, seed spread {seed_sd:.4f}): " + "; ".join(row))
