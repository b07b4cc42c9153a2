"""The comparison's report: compare.json, results.md and the two plots, rebuilt from the cells."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from evotrainer.base.files import atomic_write_text
from evotrainer.compare.arms import LOOPS, STATIC
from evotrainer.compare.results import Cell, Comparison


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
            f"{ref.cpu_seconds / 60:.0f} CPU minutes a seed)." + against_search(c))


def search_effect(c: Comparison) -> tuple[float, float, float, float, float] | None:
    """EvoTrainer minus the hyperparameter search of the same seeds, paired over seeds x items: the mean, its 95%
    interval, and the GRPO steps a seed of the search and of EvoTrainer; None without both arms on one test set."""
    return search_effect_of(c.cells, c.seeds)


def search_effect_of(cells: list[Cell], seeds: list[int]) -> tuple[float, float, float, float, float] | None:
    """`search_effect` of a comparison's cells (`benchmarks/repair.py` reads them from the record alone)."""
    from evotrainer.trainer.backtest.statistics import paired_bootstrap

    by = {(x.arm, x.seed): x for x in cells}
    pairs = [(by[("evotrainer", s)], by[("hpo", s)]) for s in seeds if ("evotrainer", s) in by and ("hpo", s) in by]
    if not pairs or any(e.item_ids != h.item_ids for e, h in pairs):
        return None
    d, lo, hi, _ = paired_bootstrap(np.array([np.array(e.greedy_correct, float) - np.array(h.greedy_correct, float)
                                              for e, h in pairs]), 1000)
    return d, lo, hi, float(np.mean([h.total_steps for _, h in pairs])), float(np.mean([e.total_steps
                                                                                        for e, _ in pairs]))


def against_search(c: Comparison) -> str:
    """EvoTrainer against the hyperparameter search of the same seeds, as a sentence ('' without it)."""
    effect = search_effect(c)
    if effect is None:
        return ""
    d, lo, hi, hpo_steps, evo_steps = effect
    return (f" Against the hyperparameter search (`hpo`, {hpo_steps:.0f} GRPO steps a seed against EvoTrainer's "
            f"{evo_steps:.0f}): {d:+.3f} [{lo:+.3f}, {hi:+.3f}].")


def markdown(c: Comparison, pages: list[str] = ()) -> str:
    k = c.budget.k
    lines = [f"# EvoTrainer against static recipes: {c.domain}", "",
             f"Command: `{c.command}`; the cells took {sum(x.wall_seconds for x in c.cells) / 60:.0f} min of wall "
             f"time on this machine in all. Seeds {c.seeds}; budget `{c.budget_name}` (generations: "
             f"{c.budget.generations}, candidates: {c.budget.candidates} per loop arm); every arm starts from the "
             f"policy {Path(c.start_checkpoint).name} and the harness {c.harness or 'templates/' + c.domain}"
             + (f" (digest {c.harness_digest})" if c.harness_digest else "") + ". Sealed test: "
             f"{len(c.cells[0].item_ids) if c.cells else 0} items, greedy and avg@{k}. Intervals: 95%, two-level "
             "bootstrap over seeds and items; ± is the interval's half-width."
             + (" Accuracy here is the resolve rate: episodes whose submitted repository passes the hidden tests."
                if c.domain == "swe" else ""), ""]
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
    mdes = [v["mde"] for cell in c.cells for v in cell.lineage if v.get("mde") is not None]
    if mdes:
        lines += ["", f"Backtest decisions with a short run: {len(mdes)}; their minimum detectable effect (80% power, "
                      f"5% level): median {float(np.median(mdes)):.3f}, range {min(mdes):.3f}-{max(mdes):.3f}."]
    promos = [(cell.arm, cell.seed, p) for cell in c.cells for p in cell.promotions]
    if promos:
        lines += ["", "Promotions and their effect on the sealed test (the policy handed on minus the generation's "
                  "control arm, what the main line would have been without it: same start, seed and steps; a "
                  "replay-only promotion: the next generation's training minus the champion it replaced; invalid "
                  "when the interval lies below zero; a repair of a gate the champion failed: minus the policy both "
                  "arms started from, the control it replaced beside, invalid when shown worse than both):", ""]
        for arm, seed, p in promos:
            effect = (f"{p['test_before']:.3f} -> {p['test_after']:.3f}, {p['delta']:+.3f} "
                      f"[{p['ci'][0]:+.3f}, {p['ci'][1]:+.3f}]{' **invalid**' if p['invalid'] else ''}"
                      if p["measured"] else "not measured (no later policy)")
            if p.get("against") == "start":
                v = p["vs_control"]
                effect = (f"repairs {', '.join(p['repairs'])}; against its start {effect}; against the control "
                          f"{v['test_before']:.3f}: {v['delta']:+.3f} [{v['ci'][0]:+.3f}, {v['ci'][1]:+.3f}]")
            lines.append(f"- {arm} s{seed} g{p['generation']} `{p['branch']}`: {effect}")
    searches = [x for x in c.cells if x.search is not None]
    if searches:
        lines += ["", "The hyperparameter search (`hpo`): trials of the template's recipe knobs, each the first "
                  "steps of the main line scored on sealed dev; the best continued to the main line's length:", ""]
        for x in searches:
            best = next(t for t in x.search.trials if t.number == x.search.chosen)
            changed = {k: v for k, v in best.params.items() if v != x.search.trials[0].params.get(k)}
            lines.append(f"- seed {x.seed}: {len(x.search.trials)} trials of {x.search.trial_steps} steps, dev "
                         f"{min(t.dev_accuracy for t in x.search.trials):.3f}-"
                         f"{max(t.dev_accuracy for t in x.search.trials):.3f}; chose trial {best.number} (dev "
                         f"{best.dev_accuracy:.3f}): "
                         + (", ".join(f"{k}={v}" for k, v in changed.items()) or "the template's own recipe"))
    if pages:
        lines += ["", "Each loop run's own page (`evotrainer report`; lineage with diffs, verdicts, evidence), in the "
                      "comparison directory: " + ", ".join(f"`{p}`" for p in pages)]
    lines += ["", "![accuracy against compute](accuracy_vs_compute.png)", "", "![lineage](lineage.png)", ""]
    return "\n".join(lines)


COLORS = {"reference": "#444444", "clip_higher": "#8c564b", "dr_grpo": "#9467bd", "zero_var": "#e377c2",
          "hpo": "#17becf", "evotrainer": "#d62728", "no_revision": "#ff7f0e", "no_memory": "#2ca02c",
          "replay_only": "#1f77b4", "evotrainer_llm": "#bcbd22"}


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
             "reject": ("o", "#999999", "rejected (measured harmful)"),
             "inconclusive": ("s", "#1f77b4", "inconclusive"),
             "revise": ("D", "#ff7f0e", "sent to diagnostics revision")}
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


def run_pages(c: Comparison, out: Path) -> list[str]:
    """The HTML reports the loop runs wrote when they finished (`Compare._loop`), relative to `out`."""
    pages = [out / "runs" / f"{cell.arm}-s{cell.seed}" / "reports" / "report.html" for cell in c.cells]
    return [str(p.relative_to(out)) for p in pages if p.is_file()]


def write_report(c: Comparison, out: Path) -> None:
    atomic_write_text(out / "compare.json", c.model_dump_json(indent=1))
    plot(c, out)
    atomic_write_text(out / "results.md", markdown(c, run_pages(c, out)))

