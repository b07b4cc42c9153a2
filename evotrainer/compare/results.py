"""What a comparison measured: one `Cell` per (arm, seed), an `ArmSummary` per arm with the paired difference to
the reference over seeds x items, the whole `Comparison`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from evotrainer.compare.arms import CompareBudget
from evotrainer.compare.hpo import Search


class Cell(BaseModel):
    arm: str
    seed: int
    checkpoint: str
    main_steps: int  # GRPO steps from the starting policy to the evaluated one
    total_steps: int  # every GRPO step the arm took, backtests included
    cpu_seconds: float
    wall_seconds: float
    test_accuracy: float  # greedy
    test_avg_at_k: float
    item_ids: list[str]
    greedy_correct: list[bool]
    k: int = 0  # samples per item for avg@k
    sampled_correct: list[int] = []  # per item: how many of the k samples were correct
    promotions: list[dict] = []  # loop arms: branch, generation, test delta against the champion it replaced
    lineage: list[dict] = []  # loop arms: every candidate with its generation, decision, dev effect, gates
    search: Search | None = None  # the hpo arm: its trials and the recipe it chose


class ArmSummary(BaseModel):
    arm: str
    seeds: list[int]
    test_accuracy: float
    test_ci: tuple[float, float]
    avg_at_k: float
    avg_at_k_ci: tuple[float, float]
    vs_reference: tuple[float, float, float] | None  # paired over seeds x items: delta, low, high
    main_steps: float
    total_steps: float
    cpu_seconds: float
    promotions: int
    gate_rejections: int
    invalid_promotions: int


class Comparison(BaseModel):
    domain: str
    harness: str | None = None  # the starting harness of every arm: a directory (None: the domain's template)
    harness_digest: str | None = None  # its content (workspaces/source.py)
    budget: CompareBudget
    budget_name: str
    seeds: list[int]
    arms: list[str]
    start_checkpoint: str
    start_accuracy: float | None = None  # the starting policy on the same test items: greedy, and avg@k (seed 0)
    start_avg_at_k: float | None = None
    command: str
    wall_seconds: float
    summaries: list[ArmSummary]
    cells: list[Cell]



def summarize(cells: list[Cell], arms: list[str]) -> list[ArmSummary]:
    """Per arm: greedy accuracy and avg@k, each the mean over seeds with a two-level bootstrap interval (seeds, then
    items), and the paired difference to the reference on the same seeds and items."""
    from evotrainer.trainer.backtest.statistics import paired_bootstrap

    by = {(c.arm, c.seed): c for c in cells}
    out = []
    for arm in arms:
        mine = [c for c in cells if c.arm == arm]
        if not mine:
            continue
        greedy = np.array([c.greedy_correct for c in mine], dtype=float)
        acc, lo, hi, _ = paired_bootstrap(greedy, 1000)
        if all(c.k and len(c.sampled_correct) == len(c.item_ids) for c in mine):
            samples = np.array([np.array(c.sampled_correct, dtype=float) / c.k for c in mine])
            avg_k, k_lo, k_hi, _ = paired_bootstrap(samples, 1000)
        else:  # no samples drawn (k = 0)
            avg_k = k_lo = k_hi = float(np.mean([c.test_avg_at_k for c in mine]))
        vs = None
        ref = [by.get(("reference", c.seed)) for c in mine]
        if arm != "reference" and all(ref) and all(r.item_ids == c.item_ids for r, c in zip(ref, mine)):
            diffs = greedy - np.array([r.greedy_correct for r in ref], dtype=float)
            vs = paired_bootstrap(diffs, 1000)[:3]
        promos = [p for c in mine for p in c.promotions]
        out.append(ArmSummary(
            arm=arm, seeds=[c.seed for c in mine], test_accuracy=acc, test_ci=(lo, hi),
            avg_at_k=avg_k, avg_at_k_ci=(k_lo, k_hi),
            vs_reference=vs, main_steps=float(np.mean([c.main_steps for c in mine])),
            total_steps=float(np.mean([c.total_steps for c in mine])),
            cpu_seconds=float(np.mean([c.cpu_seconds for c in mine])), promotions=len(promos),
            gate_rejections=sum(1 for c in mine for v in c.lineage
                                if v["decision"] != "promote" and v["failed_gates"]),
            invalid_promotions=sum(1 for p in promos if p.get("invalid"))))
    return out


def cells_on_record(cells_dir: Path) -> dict[tuple[str, int], dict]:
    """A comparison's cells as written (`cells/<arm>-s<seed>.json`), by (arm, seed), as plain records: not the ones
    set aside beside them (`<arm>-s<seed>.<TAG>.json`: a stale baseline, a loop cell of `repair.py --again`)."""
    out = {}
    for f in sorted(cells_dir.glob("*.json")):
        c = json.loads(f.read_text())
        if c is not None and f.stem == f"{c['arm']}-s{c['seed']}":
            out[(c["arm"], c["seed"])] = c
    return out
