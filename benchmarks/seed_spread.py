"""The between-seed spread of a paired recipe effect that one seed's bootstrap cannot see (`BacktestConfig.seed_sd`).

    python benchmarks/seed_spread.py

From wave 1's committed comparisons (docs/results/wave1/<domain>/compare.json: each static recipe minus the
reference on the same 3 seeds and sealed test items, 20 steps): per recipe, the variance of its per-seed paired
effects minus the mean item-level variance (method of moments), then the root mean square over recipes.
Printed 2026-12-05: 0.0060 (per recipe 0.0000-0.0083).
"""

import json
import math
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent / "docs" / "results" / "wave1"
taus = []
for domain in ("math", "code"):
    cells = {(c["arm"], c["seed"]): c for c in json.loads((ROOT / domain / "compare.json").read_text())["cells"]}
    for arm in ("dr_grpo", "zero_var", "clip_higher"):
        d, se2 = [], []
        for s in (0, 1, 2):
            g = np.array(cells[(arm, s)]["greedy_correct"], float) - np.array(cells[("reference", s)]["greedy_correct"],
                                                                              float)
            d.append(g.mean())
            se2.append(g.var(ddof=1) / len(g))
        tau = math.sqrt(max(np.var(d, ddof=1) - np.mean(se2), 0.0))
        taus.append(tau)
        print(f"{domain} {arm}: per-seed effects {np.round(d, 3).tolist()}, seed spread {tau:.4f}")
print(f"root mean square over recipes: {math.sqrt(np.mean(np.square(taus))):.4f}")
