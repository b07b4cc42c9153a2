"""`evotrainer compare`: EvoTrainer against static human-engineered recipes and its own ablations, from the same warm
policy, with the same seeds, scored by the same sealed test split (DESIGN §5, §7).

Arms
  reference     the domain's template harness, never evolved, trained for as many main-line steps as the EvoTrainer
                champion line of the same seed (the template already is DAPO-style: token-level loss, clip-higher)
  clip_higher   GRPO's own sequence-level loss with the clip-higher upper bound
  dr_grpo       Dr. GRPO: no per-group std scaling, its length-unbiased loss
  zero_var      the reference plus zero-variance-group filtering (the template's `drop_dead_groups`)
  evotrainer    the co-evolution loop with the offline meta-policy
  no_revision, no_memory, replay_only   the loop with one part switched off (diagnostics revision, skill memory,
                short-run backtests)

Every (arm, seed) is a cell whose result is written to DIR/cells/ when it is done: an interrupted comparison rerun with
the same command resumes at the first missing cell (a loop arm resumes its own run from its graph checkpoint). The
report (compare.json, results.md, accuracy_vs_compute.png, lineage.png) is rebuilt from the cells.

Compute is counted as GRPO steps (backtest arms included) and CPU seconds of this process and its children.
A promotion is invalid when the policy it hands on scores significantly lower on the sealed test than the champion
it replaced (the paired 95% interval lies below zero).
"""

from __future__ import annotations

import json
import resource
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from pydantic import BaseModel, Field

from evotrainer.base.errors import UserError
from evotrainer.base.files import atomic_write_text

STATIC: dict[str, dict[str, object]] = {  # harness.yaml keys changed from the template
    "reference": {},
    # clip-higher only binds when a batch is reused: with one update per batch the ratio is 1 (README: the loop)
    "clip_higher": {"loss_type": "grpo", "epsilon_high": 0.28, "num_iterations": 2},
    "dr_grpo": {"loss_type": "dr_grpo", "scale_rewards": "none"},
    "zero_var": {"group_filters": ["drop_dead_groups"]},
}
LOOPS: dict[str, dict[str, bool]] = {  # LoopConfig switches
    "evotrainer": {},
    "no_revision": {"revise_diagnostics": False},
    "no_memory": {"skill_memory": False},
    "replay_only": {"short_runs": False},
}
ARMS = ("evotrainer", *STATIC, *[a for a in LOOPS if a != "evotrainer"])
DOMAINS = ("math", "code")


class Budget(BaseModel):
    """What each loop arm may spend (the static arms follow the EvoTrainer champion line)."""

    generations: int = Field(2, ge=1)
    candidates: int = Field(2, ge=1)
    train_steps: int | None = Field(None, ge=1, description="champion steps per generation (None: the loop default)")
    backtest_steps: int | None = Field(None, ge=1)
    short_seeds: int | None = Field(None, ge=1, description="seeds of a short run's first round")
    max_seeds: int | None = Field(None, ge=1)
    dev_items: int | None = Field(None, ge=1)
    test_items: int | None = Field(None, ge=1, description="sealed test items (None: the whole split)")
    k: int = Field(4, ge=0, description="samples per test item for avg@k")

    def loop_overrides(self) -> dict:
        """The `LoopConfig` settings this budget fixes (the rest: the loop's defaults for the domain)."""
        return {k: v for k, v in dict(train_steps=self.train_steps, backtest_steps=self.backtest_steps,
                                      seeds=self.short_seeds, max_seeds=self.max_seeds,
                                      dev_items=self.dev_items).items() if v is not None}


BUDGETS = {
    "default": Budget(),
    "smoke": Budget(generations=1, candidates=1, train_steps=2, backtest_steps=2, short_seeds=1, max_seeds=1,
                    dev_items=40, test_items=60, k=2),
}


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
    budget: Budget
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


def _cpu() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def line_steps(checkpoint: Path, since: Path | None = None) -> int:
    """GRPO steps from `since` (default: the warm policy) to `checkpoint`, summed along the parents recorded in each
    meta.json."""
    steps, seen = 0, set()
    path, stop = Path(checkpoint).resolve(), Path(since).resolve() if since else None
    while (path / "meta.json").is_file() and path not in seen and path != stop:
        seen.add(path)
        meta = json.loads((path / "meta.json").read_text())
        if "parent" not in meta:
            break  # a warm policy (or a user's model): the line starts here
        steps += int(meta.get("steps", 0))
        path = Path(meta["parent"]).resolve()
    return steps


def static_harness(domain: str, arm: str, dest: Path) -> Path:
    """The domain's template with the arm's keys set (a list is a top-level `harness.yaml` list, a scalar a trainer
    knob), comments kept; validated like any harness."""
    from evotrainer.agents.offline.edits import EditError, set_knob, set_list
    from evotrainer.workspaces import TEMPLATES

    if dest.is_dir():
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(TEMPLATES / domain, tmp)
    text = (tmp / "harness.yaml").read_text()
    for key, value in STATIC[arm].items():
        try:  # a knob the template leaves at TRL's default gets its own line
            text = set_list(text, key, value) if isinstance(value, list) else set_knob(text, key, value)
        except EditError as e:
            raise UserError(f"the {arm} arm cannot be built from the {domain} template: {e}") from e
    changed = "".join(f", {k}={'[' + ', '.join(v) + ']' if isinstance(v, list) else v}"
                      for k, v in STATIC[arm].items())
    (tmp / "harness.yaml").write_text(f"# evotrainer compare: the {arm} arm ({domain} template{changed})\n" + text)
    from evotrainer.trainer import jobs

    problems = jobs.validate_harness(tmp, tmp.parent, label=f"the {arm} harness")
    if problems:
        raise UserError(f"the {arm} arm's harness is invalid: {problems[0]}")
    tmp.rename(dest)
    return dest


class Compare:
    """One comparison directory: cells computed in order, each once."""

    def __init__(self, out: Path, domain: str, seeds: list[int], arms: list[str], budget: Budget, budget_name: str,
                 checkpoint: Path, command: str, status: Callable[[str], None] | None = None):
        self.out, self.domain, self.seeds, self.arms = out, domain, seeds, arms
        self.budget, self.budget_name, self.start, self.command = budget, budget_name, checkpoint, command
        self.status = status or (lambda text: None)

    def cell_path(self, arm: str, seed: int) -> Path:
        return self.out / "cells" / f"{arm}-s{seed}.json"

    def cell(self, arm: str, seed: int, main_steps: int) -> Cell:
        path = self.cell_path(arm, seed)
        if path.is_file():
            cell = Cell.model_validate_json(path.read_text())
            if self.budget.k and not cell.sampled_correct:  # written before per-item samples were kept
                ev = self._test(Path(cell.checkpoint), seed, path.parent)  # the cached evaluation, read again
                if ev.item_ids != cell.item_ids:
                    raise UserError(f"{path} and the evaluation cached beside {cell.checkpoint} score different "
                                    "items: remove the cell to compute it again")
                cell = cell.model_copy(update={"k": ev.k, "sampled_correct": ev.sampled_correct})
                atomic_write_text(path, cell.model_dump_json(indent=1))
            return cell
        self.status(f"{arm} seed {seed}")
        started, cpu = time.time(), _cpu()
        cell = self._loop(arm, seed) if arm in LOOPS else self._static(arm, seed, main_steps)
        cell = cell.model_copy(update={"cpu_seconds": round(_cpu() - cpu, 1),
                                       "wall_seconds": round(time.time() - started, 1)})
        atomic_write_text(path, cell.model_dump_json(indent=1))
        return cell

    def _test(self, checkpoint: Path, seed: int, work: Path, k: int | None = None):
        from evotrainer.trainer import jobs

        return jobs.evaluate(checkpoint, self.domain, "test", work, k=self.budget.k if k is None else k,
                             limit=self.budget.test_items, seed=seed)

    def _static(self, arm: str, seed: int, steps: int) -> Cell:
        from evotrainer.trainer import jobs
        from evotrainer.trainer.grpo import TrainSpec

        harness = static_harness(self.domain, arm, self.out / "harnesses" / arm)
        work = self.out / "static" / f"{arm}-s{seed}"
        ckpt = work / "checkpoints" / "policy"
        if not (ckpt / "meta.json").is_file():
            spec = TrainSpec(domain=self.domain, checkpoint=str(self.start), harness_dir=str(harness), steps=steps,
                             seed=seed, out_dir=str(work), checkpoint_id="policy",
                             checkpoints_dir=str(work / "checkpoints"), evidence_dir=str(work / "evidence"),
                             run=f"compare-{arm}", harness_commit=f"static:{arm}",
                             result_path=str(work / "specs" / "train.result.json"))
            jobs.train(spec, work)
        ev = self._test(ckpt, seed, work)
        return Cell(arm=arm, seed=seed, checkpoint=str(ckpt), main_steps=line_steps(ckpt, self.start),
                    total_steps=steps, cpu_seconds=0, wall_seconds=0, test_accuracy=ev.accuracy,
                    test_avg_at_k=ev.avg_at_k, item_ids=ev.item_ids, greedy_correct=ev.greedy_correct, k=ev.k,
                    sampled_correct=ev.sampled_correct)

    def _loop(self, arm: str, seed: int) -> Cell:
        from evotrainer.agents.offline.policy import OfflinePolicy
        from evotrainer.graph.build import drive, open_run
        from evotrainer.workspaces.run import RunWorkspace

        b = self.budget
        run_dir = self.out / "runs" / f"{arm}-s{seed}"
        if (run_dir / "run.yaml").is_file():
            ws = RunWorkspace.open(run_dir)
        else:
            # every run its own skill memory: seeds stay independent, and no arm learns from another
            ws = open_run(run_dir, domain=self.domain, budget={"generations": b.generations,
                                                               "candidates": b.candidates},
                          meta_llm="offline", api_base=None, skills=str(self.out / "skills" / f"{arm}-s{seed}"),
                          checkpoint=str(self.start), seed=seed, loop_overrides={**b.loop_overrides(), **LOOPS[arm]})
        summary = drive(ws, OfflinePolicy(), fresh=None)  # a run interrupted earlier resumes
        if not summary.finished:
            raise UserError(f"the {arm} run of seed {seed} stopped before its end ({summary.stop_reason}): rerun the "
                            "same compare command to resume it")
        ckpt = ws.champion_checkpoint() or self.start
        ev = self._test(ckpt, seed, run_dir)
        lineage, promotions = self._lineage(ws), []
        for h in summary.history:
            if h["promoted"]:
                promotions.append(self._promotion(ws, h, seed))
        return Cell(arm=arm, seed=seed, checkpoint=str(ckpt), main_steps=line_steps(ckpt, self.start),
                    total_steps=summary.steps_used, cpu_seconds=0, wall_seconds=0, test_accuracy=ev.accuracy,
                    test_avg_at_k=ev.avg_at_k, item_ids=ev.item_ids, greedy_correct=ev.greedy_correct, k=ev.k,
                    sampled_correct=ev.sampled_correct, promotions=promotions, lineage=lineage)

    @staticmethod
    def _lineage(ws) -> list[dict]:
        out = []
        for r in ws.harness.lineage():
            v = ws.verdict(r.branch)
            if v is None:
                continue
            out.append({"generation": r.generation, "branch": r.branch, "transform": v.get("transform"),
                        "decision": v["decision"], "effect": v.get("effect"), "ci_low": v.get("ci_low"),
                        "failed_gates": v.get("failed_gates", []), "repairs": v.get("repairs", [])})
        return out

    def _promotion(self, ws, h: dict, seed: int) -> dict:
        """The promoted harness's effect on the sealed test: the policy it handed on against the champion it
        replaced (the generation's trained checkpoint); a replay-only promotion hands on the same policy, so its
        harness is judged by the next generation's training."""
        from evotrainer.trainer.backtest import paired_bootstrap

        g = h["generation"]
        before = ws.path / "checkpoints" / f"g{g}-train" / "checkpoints" / "policy"
        after = Path(h["checkpoint"])
        if after.resolve() == before.resolve():
            after = ws.path / "checkpoints" / f"g{g + 1}-train" / "checkpoints" / "policy"
        record = {"generation": g, "branch": h["promoted"], "before": str(before), "after": str(after)}
        if not (after / "config.json").is_file():
            return {**record, "measured": False, "invalid": False}
        a = self._test(before, seed, ws.path, k=0)
        b = self._test(after, seed, ws.path, k=0)
        diffs = np.array([b.greedy_correct], dtype=float) - np.array([a.greedy_correct], dtype=float)
        d, lo, hi, _ = paired_bootstrap(diffs, 1000)
        return {**record, "measured": True, "test_before": a.accuracy, "test_after": b.accuracy, "delta": d,
                "ci": [lo, hi], "invalid": hi < 0}

    def run(self) -> Comparison:
        started = time.time()
        cells: list[Cell] = []
        for seed in self.seeds:
            main = None
            if "evotrainer" in self.arms:
                evo = self.cell("evotrainer", seed, 0)
                cells.append(evo)
                main = evo.main_steps
            if main is None:  # no EvoTrainer arm: the champion line's length without promotions
                from evotrainer.graph.build import loop_config

                main = self.budget.generations * loop_config(self.domain, self.budget.loop_overrides()).train_steps
            cells += [self.cell(arm, seed, main) for arm in self.arms if arm != "evotrainer"]
        start = self._test(self.start, 0, self.out / "start")  # cached beside the checkpoint
        comparison = Comparison(domain=self.domain, budget=self.budget, budget_name=self.budget_name,
                                seeds=self.seeds, arms=self.arms, start_checkpoint=str(self.start),
                                start_accuracy=start.accuracy, start_avg_at_k=start.avg_at_k,
                                command=self.command, wall_seconds=round(time.time() - started, 1),
                                summaries=summarize(cells, self.arms), cells=cells)
        write_report(comparison, self.out)
        return comparison


def summarize(cells: list[Cell], arms: list[str]) -> list[ArmSummary]:
    """Per arm: greedy accuracy and avg@k, each the mean over seeds with a two-level bootstrap interval (seeds, then
    items), and the paired difference to the reference on the same seeds and items."""
    from evotrainer.trainer.backtest import paired_bootstrap

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


def headline(c: Comparison) -> str:
    """The answer the comparison exists for: EvoTrainer against the reference at equal main-line steps, and the
    compute it spent to get there."""
    by = {s.arm: s for s in c.summaries}
    evo, ref = by.get("evotrainer"), by.get("reference")
    if evo is None or ref is None or evo.vs_reference is None:
        return ""
    d, lo, hi = evo.vs_reference
    verdict = "beats" if lo > 0 else "scores below" if hi < 0 else "is not distinguishable from"
    items = len(c.cells[0].item_ids)
    return (f"**EvoTrainer {verdict} the reference at equal main-line steps** ({evo.main_steps:.0f} GRPO steps a "
            f"seed on average): sealed test greedy {evo.test_accuracy:.3f} against {ref.test_accuracy:.3f}, paired "
            f"difference {d:+.3f} (95% interval [{lo:+.3f}, {hi:+.3f}], {len(evo.seeds)} seeds x {items} items). "
            f"It spent {evo.total_steps / max(ref.total_steps, 1):.1f}x the reference's GRPO steps "
            f"({evo.total_steps:.0f} against {ref.total_steps:.0f} a seed, short-run arms included) and "
            f"{evo.cpu_seconds / max(ref.cpu_seconds, 1):.1f}x its CPU seconds ({evo.cpu_seconds / 60:.0f} against "
            f"{ref.cpu_seconds / 60:.0f} CPU minutes a seed).")


def markdown(c: Comparison) -> str:
    k = c.budget.k
    lines = [f"# EvoTrainer against static recipes: {c.domain}", "",
             f"Command: `{c.command}`; the cells took {sum(x.wall_seconds for x in c.cells) / 60:.0f} min of wall "
             f"time on this machine in all. Seeds {c.seeds}; budget `{c.budget_name}` (generations: "
             f"{c.budget.generations}, candidates: {c.budget.candidates} per loop arm); every arm starts from "
             f"{Path(c.start_checkpoint).name}. Sealed test: "
             f"{len(c.cells[0].item_ids) if c.cells else 0} items, greedy and avg@{k}. Intervals: 95%, two-level "
             "bootstrap over seeds and items; ± is the interval's half-width.", ""]
    if headline(c):
        lines += [headline(c), ""]
    if c.start_accuracy is not None:
        lines += [f"The starting policy scores {c.start_accuracy:.3f} greedy"
                  + (f", {c.start_avg_at_k:.3f} avg@{k}" if k and c.start_avg_at_k is not None else "")
                  + " on the same items.", ""]
    lines += [f"| arm | test greedy | avg@{k} | vs reference (paired) | main-line steps | all steps | CPU s | "
             "promoted | gate-rejected | invalid |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in c.summaries:
        vs = "-" if s.vs_reference is None else \
            f"{s.vs_reference[0]:+.3f} [{s.vs_reference[1]:+.3f}, {s.vs_reference[2]:+.3f}]"
        lines.append(f"| {s.arm} | {s.test_accuracy:.3f} ±{(s.test_ci[1] - s.test_ci[0]) / 2:.3f} "
                     f"[{s.test_ci[0]:.3f}, {s.test_ci[1]:.3f}] | "
                     f"{s.avg_at_k:.3f} [{s.avg_at_k_ci[0]:.3f}, {s.avg_at_k_ci[1]:.3f}] | {vs} | "
                     f"{s.main_steps:.0f} | {s.total_steps:.0f} | {s.cpu_seconds:.0f} | {s.promotions} | "
                     f"{s.gate_rejections} | {s.invalid_promotions} |")
    lines += ["", "Per seed (sealed test greedy):", "", "| arm | " + " | ".join(f"seed {s}" for s in c.seeds) + " |",
              "|---|" + "---|" * len(c.seeds)]
    by = {(x.arm, x.seed): x for x in c.cells}
    for s in c.summaries:
        lines.append(f"| {s.arm} | " + " | ".join(f"{by[(s.arm, seed)].test_accuracy:.3f}" if (s.arm, seed) in by
                                                  else "-" for seed in c.seeds) + " |")
    promos = [(cell.arm, cell.seed, p) for cell in c.cells for p in cell.promotions]
    if promos:
        lines += ["", "Promotions and their effect on the sealed test (the policy handed on minus the champion it "
                  "replaced; invalid when the interval lies below zero):", ""]
        for arm, seed, p in promos:
            effect = (f"{p['test_before']:.3f} -> {p['test_after']:.3f}, {p['delta']:+.3f} "
                      f"[{p['ci'][0]:+.3f}, {p['ci'][1]:+.3f}]{' **invalid**' if p['invalid'] else ''}"
                      if p["measured"] else "not measured (no later policy)")
            lines.append(f"- {arm} s{seed} g{p['generation']} `{p['branch']}`: {effect}")
    lines += ["", "![accuracy against compute](accuracy_vs_compute.png)", "", "![lineage](lineage.png)", ""]
    return "\n".join(lines)


COLORS = {"reference": "#444444", "clip_higher": "#8c564b", "dr_grpo": "#9467bd", "zero_var": "#e377c2",
          "evotrainer": "#d62728", "no_revision": "#ff7f0e", "no_memory": "#2ca02c", "replay_only": "#1f77b4"}


def plot(c: Comparison, out: Path) -> list[Path]:
    """Accuracy against compute (two panels: GRPO steps, CPU seconds) and the loop arms' lineages."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = [out / "accuracy_vs_compute.png", out / "lineage.png"]
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8), gridspec_kw={"width_ratios": [1, 1, 0.8]})
    n = len(c.summaries)
    for ax, field, label in ((axes[0], "total_steps", "GRPO steps per seed (backtests included)"),
                             (axes[1], "cpu_seconds", "CPU seconds per seed")):
        xs = [getattr(s, field) for s in c.summaries]
        dodge = 0.008 * (max(xs) - min(xs) or max(xs) or 1)  # arms at the same compute side by side, not hidden
        for i, s in enumerate(c.summaries):
            err = [[s.test_accuracy - s.test_ci[0]], [s.test_ci[1] - s.test_accuracy]]
            ax.errorbar([xs[i] + (i - (n - 1) / 2) * dodge], [s.test_accuracy], yerr=err,
                        fmt="o" if s.arm in STATIC else "s", color=COLORS.get(s.arm, "black"), capsize=4,
                        label=s.arm)
        if c.start_accuracy is not None:
            ax.axhline(c.start_accuracy, color="black", ls="--", lw=0.8, label="starting policy")
        ax.set_xlabel(label)
        ax.set_ylabel("sealed test accuracy (greedy)")
        lo, hi = ax.get_ylim()
        ax.set_ylim(min(lo, lo / 2 + hi / 2 - 0.02), max(hi, lo / 2 + hi / 2 + 0.02))  # never a sub-point scale
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="best")
    axes[0].set_title("accuracy against GRPO steps", fontsize=10)
    axes[1].set_title("accuracy against CPU time", fontsize=10)
    # the question itself: each arm minus the reference on the same seeds and items
    paired = [s for s in c.summaries if s.vs_reference is not None]
    ax = axes[2]
    for i, s in enumerate(paired):
        d, lo, hi = s.vs_reference
        ax.errorbar([d], [i], xerr=[[d - lo], [hi - d]], fmt="o" if s.arm in STATIC else "s",
                    color=COLORS.get(s.arm, "black"), capsize=4)
    ax.axvline(0, color="#444444", lw=1)
    ax.set_yticks(range(len(paired)), [s.arm for s in paired])
    ax.set_ylim(len(paired) - 0.5, -0.5)
    lo, hi = ax.get_xlim()
    ax.set_xlim(min(lo, -0.02), max(hi, 0.02))
    ax.set_xlabel("minus the reference, sealed test greedy (paired)")
    ax.set_title("difference to the reference at equal main-line steps", fontsize=10)
    ax.grid(alpha=0.3)
    fig.suptitle(f"{c.domain}: sealed test accuracy against training compute "
                 f"(mean and 95% interval over {len(c.seeds)} seed{'s' if len(c.seeds) > 1 else ''})")
    fig.tight_layout()
    fig.savefig(paths[0], dpi=120)
    plt.close(fig)

    loops = [a for a in c.arms if a in LOOPS]
    fig, axes = plt.subplots(1, max(len(loops), 1), figsize=(4.2 * max(len(loops), 1), 4.2), squeeze=False,
                             sharey=True)
    style = {"promote": ("^", "#2ca02c", "promoted"), "gate": ("x", "#d62728", "rejected by a gate"),
             "reject": ("o", "#999999", "rejected"), "revise": ("D", "#ff7f0e", "sent to diagnostics revision")}
    for ax, arm in zip(axes[0], loops):
        seen = set()
        for cell in (x for x in c.cells if x.arm == arm):
            for i, cand in enumerate(cell.lineage):
                kind = cand["decision"] if cand["decision"] != "reject" or not cand["failed_gates"] else "gate"
                marker, color, label = style[kind]
                jitter = (cell.seed - (len(c.seeds) - 1) / 2) * 0.08 + (i % 3 - 1) * 0.03
                ax.scatter(cand["generation"] + jitter, cand["effect"] if cand["effect"] is not None else 0.0,
                           marker=marker, color=color, s=40, label=None if kind in seen else label)
                seen.add(kind)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_title(arm + (" (no short runs: every effect at 0)" if arm == "replay_only" else ""), fontsize=10)
        ax.set_xlabel("generation")
        ax.set_xticks(range(1, c.budget.generations + 1))
        ax.set_xlim(0.5, c.budget.generations + 0.5)
        lo, hi = ax.get_ylim()
        ax.set_ylim(min(lo, -0.05), max(hi, 0.05))
        ax.grid(alpha=0.3)
        if seen:
            ax.legend(fontsize=7, loc="best")
    axes[0][0].set_ylabel("candidate minus control, sealed dev (short run)")
    fig.suptitle(f"{c.domain}: the lineage of the loop arms, every candidate of every seed (a gate rejection without "
                 "a short run at 0)", fontsize=11)
    fig.tight_layout()
    fig.savefig(paths[1], dpi=120)
    plt.close(fig)
    return paths


def write_report(c: Comparison, out: Path) -> None:
    atomic_write_text(out / "compare.json", c.model_dump_json(indent=1))
    plot(c, out)
    atomic_write_text(out / "results.md", markdown(c))


def check_request(out: Path, request: dict) -> None:
    """Record the request in `out`, refusing one that differs from the recorded one in anything but the number of
    seeds: more seeds extend a comparison (the cells of the first seeds are kept), other settings would mix arms
    measured differently."""
    req = out / "request.json"
    if req.is_file():
        before = json.loads(req.read_text())
        if {k: v for k, v in before.items() if k != "seeds"} != {k: v for k, v in request.items() if k != "seeds"}:
            raise UserError(f"{out} holds a comparison with other settings ({req.read_text().strip()}): rerun it "
                            "with those (--seeds may grow), or choose a new directory")
    atomic_write_text(req, json.dumps(request))


def compare(out: Path, domain: str, seeds: int, arms: list[str] | None, budget_name: str,
            checkpoint: Path | None, command: str, status: Callable[[str], None] | None = None,
            on_progress=None) -> Comparison:
    """Validate the request (one clear error, nothing written on bad input), then run or resume every cell."""
    from evotrainer.trainer import jobs

    if domain not in DOMAINS:
        raise UserError(f"compare supports --domain {' or '.join(DOMAINS)}, not {domain!r}")
    if budget_name not in BUDGETS:
        raise UserError(f"unknown --budget {budget_name!r}: choose one of {', '.join(BUDGETS)}")
    arms = list(arms or ARMS)
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise UserError(f"unknown arm {unknown[0]!r}: choose from {', '.join(ARMS)}")
    arms = [a for a in ARMS if a in arms]  # EvoTrainer first: the static arms match its main-line steps
    if checkpoint is not None and not (checkpoint / "config.json").is_file():
        raise UserError(f"checkpoint {checkpoint} not found or not a model directory (no config.json)")
    out.mkdir(parents=True, exist_ok=True)
    request = {"domain": domain, "seeds": seeds, "arms": arms, "budget": budget_name,
               "checkpoint": str(checkpoint.resolve()) if checkpoint else None}
    check_request(out, request)
    start = checkpoint.resolve() if checkpoint else jobs.warm_policy(domain, 0, out, on_progress=on_progress)
    return Compare(out, domain, list(range(seeds)), arms, BUDGETS[budget_name], budget_name, start, command,
                   status).run()
