"""The repair benchmark: EvoTrainer started from harnesses as practitioners write them, defects included.

    python benchmarks/repair.py [--domain all|math|code|swe] [--seeds 3] [--out ~/evotrainer-repair] [--only NAME,...]
                                [--budget default|smoke] [--clean] [--jobs N] [--again TAG] [--status] [--table]

For each flawed harness of `benchmarks/flawed/<domain>/` (every domain's by default; `--clean`: the domain's template
too, where nothing is to be repaired and the loop must not lose), `evotrainer compare --harness H` with the arms
`evotrainer`, `reference` (H never evolved) and `hpo` (a hyperparameter search over H's recipe at EvoTrainer's steps),
every arm from the cached warm policy, seeds 0..S-1, the comparison's default budget. Each harness is one compare
directory `OUT/<domain>-<name>/`, whose cells are written when done: rerun the same command to resume; `--jobs 2`
computes two cells at a time (compare's processes sharing the cells). What the evidence said of a seed (the analyzer at
the end of EvoTrainer's line and of the reference) is kept beside the cells in `repair/s<seed>.json`, so that the
committed cells, `request.json` and `repair/` resume a benchmark on a machine without its run directories. `--again TAG`
measures a changed loop against the same baselines: each EvoTrainer cell on record is set aside once
(`cells/evotrainer-s<seed>.TAG.json`) and computed again, the `reference` and `hpo` cells read where they still fit its
steps (`set_aside_loop_cells`). `--status` computes nothing: per harness, which cells are done, which one a process is
computing now, which are left, what was set aside, and about how long the cells left take at the wall times of those
on record (`status`). `--table` computes nothing either: it prints the table below from the cells on record alone (and
the evidence kept beside them), every harness whose cells are all done and none stale, and names the others
(`on_record`); `--into FILE` writes it between FILE's markers `<!-- repair.py
--table -->` and `<!-- /repair.py --table -->` instead: `--table --out docs/results/repair --into
docs/results/repair/README.md` is how the committed table is written, and tests/test_flawed.py checks that it is the
record's.

Then one table (`OUT/repair.md`, `OUT/repair.json`), per harness: its defects (each the analyzer whose evidence
shows it and the catalog transform that repairs it, read from the harness's README, `defects_of`; the `DEFECTS` and
`SECOND` tables of tests/test_flawed.py hold the same); per defect, in how many seeds the final champion
**repaired** it (a promotion of that transform, and the analyzer silent on the evidence of the champion's last
training segment) and in which generation, and whether the analyzer still fires at the end of the reference's
training; sealed test of EvoTrainer and of the reference with the paired 95%
interval (seeds x items); EvoTrainer against `hpo`; GRPO steps; invalid promotions. Below it, every test
the loop made of a defect's repair (`tests_table`): its generation, the short runs' effect on sealed dev with its
interval, the minimum detectable effect, P(gain) and the Critic's decision, so that a repair the loop did not
promote shows why: measured no better, blocked by a gate, or a gain smaller than the test could see.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import re
import sys
import threading
import time
from collections import Counter
from contextlib import nullcontext
from pathlib import Path

import numpy as np

from evotrainer.base.files import atomic_write_text
from evotrainer.base.settings import apply_offline_switches

ROOT = Path(__file__).resolve().parent
FLAWED = ROOT / "flawed"
ARMS = ["evotrainer", "reference", "hpo"]
DOMAINS = ("math", "code", "swe")
TEST_KEYS = ("generation", "decision", "effect", "ci_low", "ci_high", "mde", "p_gain", "failed_gates", "repairs",
             "fixes")


def defects_of(harness: Path) -> list[tuple[str, str]]:
    """[(analyzer, repair transform)] from the README: the k-th transform of the **Repair** paragraph (its
    "catalog: `name`" spans, in order) repairs what the k-th analyzer named in the **Evidence** paragraph shows
    (the analyzers its `code` spans name, in order; those past the last repair are supporting evidence)."""
    text = (harness / "README.md").read_text()
    evidence = re.search(r"\*\*Evidence\*\*:(.*?)(?:\n\n|$)", text, flags=re.S)
    repair = re.search(r"\*\*Repair\*\*:(.*?)(?:\n\n|$)", text, flags=re.S)
    analyzers = list(dict.fromkeys(re.findall(r"`([a-z_]+)`", evidence.group(1)))) if evidence else []
    repairs = re.findall(r"catalog:\s+`([a-z_]+)`", repair.group(1)) if repair else []
    if not repairs or len(analyzers) < len(repairs):
        sys.exit(f"error: {harness / 'README.md'} needs an **Evidence** paragraph naming the analyzer of each defect "
                 "(`name`) and a **Repair** paragraph naming each repair's catalog transform (catalog: `name`), "
                 "in the same order")
    return list(zip(analyzers, repairs))


def fires(evidence_dir: Path, generation: int, branch: str, harness: Path, analyzer: str, work: Path) -> bool | None:
    """Whether `analyzer` reports a problem (warning or worse) on one evidence slice; None when there is none."""
    from evotrainer.base.errors import UserError
    from evotrainer.trainer.diagnostics.report import health_report

    try:
        report = health_report(evidence_dir, generation, branch, harness, work)
    except UserError:
        return None
    return any(f.analyzer == analyzer and f.severity != "info" for f in report.findings)


def last_segment(run: Path) -> tuple[int, str] | None:
    """The evidence slice of the champion's last training: the last generation's promoted arm, else its control
    arm (the next segment of the unchanged champion line), else its main-line training."""
    from evotrainer.trainer.evidence import branch_dir
    from evotrainer.workspaces.run import RunWorkspace

    promoted = {r.generation: r.branch for r in RunWorkspace.open(run).harness.lineage() if r.status == "promoted"}
    gens = sorted((int(p.name[1:]) for p in (run / "evidence").glob("g*") if p.name[1:].isdigit()), reverse=True)
    for g in gens:
        slices = {p.name for p in (run / "evidence" / f"g{g}").iterdir()}
        for branch in ([promoted[g]] if g in promoted else []) + ["control", "main"]:
            if branch_dir(branch) in slices:
                return g, branch
    return None


def cell_identity(path: Path) -> str | None:
    """What a cell measured, as a digest (None while the cell is not written): its file without the seconds it
    took, so that a cell computed again identically keeps its identity and one that measured anything else does
    not."""
    if not path.is_file():
        return None
    cell = {k: v for k, v in json.loads(path.read_text()).items() if k not in ("cpu_seconds", "wall_seconds")}
    return hashlib.sha256(json.dumps(cell, sort_keys=True).encode()).hexdigest()[:16]


def evidence_checks(cmp_dir: Path, seed: int, harness: Path, analyzers: list[str], *, evotrainer_done: bool = True,
                    reference_done: bool = True, kept_only: bool = False) -> dict[str, tuple[bool | None, bool | None]]:
    """Per analyzer: (silent on EvoTrainer's last champion segment, fires on the reference's training), read from
    the run directories once and kept in `repair/s<seed>.json` beside the cells, so that a comparison resumed from
    its committed cells (without the runs) keeps them. Each half is read as soon as its cell is done (`*_done`: a run
    directory is complete then) and kept on its own: a benchmark stopped between a seed's EvoTrainer and reference
    cells, and resumed on a machine without the EvoTrainer run, still knows what its evidence said. A half that
    cannot be read (None) is not kept, so that a later run with the evidence readable answers it. A file of the first
    format (one analyzer, flat keys) answers for the harness's first defect.

    Each half is kept with the identity of the cell it was read beside (`cell_identity`) and answers only for that
    cell: a reference cell computed again for a longer EvoTrainer line (compare sets a stale cell aside), or an
    EvoTrainer cell computed again under a changed loop, has its half read anew from its own run. A half kept before
    identities were (no `cells` key) is taken to belong to the cell on record when first read here. `kept_only`:
    what is kept, for the cells on record, and nothing else (no run directory read, nothing written: `--table`)."""
    kept = cmp_dir / "repair" / f"s{seed}.json"
    found = json.loads(kept.read_text()) if kept.is_file() else {}
    if "analyzer_silent_at_end" in found:
        found = {"segment": found["segment"], "analyzers": {analyzers[0]: {
            "silent_at_end": found["analyzer_silent_at_end"], "reference_fires": found["reference_analyzer_fires"]}}}
    checks: dict[str, dict] = found.get("analyzers", {})
    segment = found.get("segment")
    now = {arm: cell_identity(cmp_dir / "cells" / f"{arm}-s{seed}.json") for arm in ("evotrainer", "reference")}
    cells = found.get("cells", now) if found else {}
    changed = bool(found) and "cells" not in found
    for arm, key in (("evotrainer", "silent_at_end"), ("reference", "reference_fires")):
        if cells.get(arm) != now[arm]:  # kept beside another cell than the one on record: read again
            for c in checks.values():
                changed |= c.pop(key, None) is not None
            segment = None if arm == "evotrainer" else segment
        cells[arm] = now[arm]
    run = cmp_dir / "runs" / f"evotrainer-s{seed}"
    ref_dir = cmp_dir / "static" / f"reference-s{seed}"
    if kept_only:
        evotrainer_done = reference_done = changed = False
    need = [a for a in analyzers if "silent_at_end" not in checks.get(a, {})]
    seg = last_segment(run) if need and evotrainer_done and run.is_dir() else None
    for a in need if seg is not None else []:
        at_end = fires(run / "evidence", seg[0], seg[1], run / "harness", a, cmp_dir / "work")
        if at_end is not None:  # None: no evidence to read
            checks.setdefault(a, {})["silent_at_end"], segment, changed = not at_end, list(seg), True
    for a in [a for a in analyzers if "reference_fires" not in checks.get(a, {})]:
        if reference_done and ref_dir.is_dir() and \
                (ref := fires(ref_dir / "evidence", None, None, harness, a, cmp_dir / "work")) is not None:
            checks.setdefault(a, {})["reference_fires"], changed = ref, True
    if changed:
        kept.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(kept, json.dumps({"segment": segment, "analyzers": checks, "cells": cells}))
    return {a: (checks.get(a, {}).get("silent_at_end"), checks.get(a, {}).get("reference_fires")) for a in analyzers}


def keep_evidence_checks(cmp_dir: Path, seeds: int, harness: Path, analyzers: list[str],
                         done: threading.Event) -> None:
    """While a comparison runs, keep each seed's evidence checks as soon as its EvoTrainer or reference cell is
    written (its run directory is complete then): a benchmark stopped before its last cell, and resumed on a machine
    without the run directories, still knows what the evidence said of the cells it finished."""
    while True:
        for s in range(seeds):
            ready = {arm: (cmp_dir / "cells" / f"{arm}-s{s}.json").is_file() for arm in ("evotrainer", "reference")}
            if any(ready.values()):
                evidence_checks(cmp_dir, s, harness, analyzers, evotrainer_done=ready["evotrainer"],
                                reference_done=ready["reference"])
        if done.wait(60):
            return


def set_aside_loop_cells(cmp_dir: Path, seeds: int, tag: str) -> list[int]:
    """`--again TAG`: the EvoTrainer cells on record are computed again (after a change to the loop), each set aside
    once as `cells/evotrainer-s<seed>.<TAG>.json` with its run directory (`runs/evotrainer-s<seed>.<TAG>`, which the
    loop would otherwise resume, finished, to the same cell) and its skill memory (`skills/evotrainer-s<seed>.<TAG>`:
    the new run starts from an empty one, as the first did). A seed whose `<TAG>` file exists was set aside already:
    a rerun of the same command resumes what the first one computed instead of setting it aside in turn. The
    reference and hpo cells are then read where the new EvoTrainer cell has the same steps and computed again where
    not (`compare` sets a stale one aside), and each half of a seed's evidence check is read again for a changed
    cell (`evidence_checks`). Returns the seeds set aside now."""
    moved = []
    for s in range(seeds):
        cell, kept = cmp_dir / "cells" / f"evotrainer-s{s}.json", cmp_dir / "cells" / f"evotrainer-s{s}.{tag}.json"
        if kept.exists():
            continue
        for kind in ("runs", "skills"):
            if (done := cmp_dir / kind / f"evotrainer-s{s}").is_dir():
                done.rename(cmp_dir / kind / f"evotrainer-s{s}.{tag}")
        kept.parent.mkdir(parents=True, exist_ok=True)
        if cell.is_file():
            cell.rename(kept)
        else:  # nothing was recorded for this seed: marked, so that what is computed from now on is kept
            atomic_write_text(kept, "null\n")
        moved.append(s)
    return moved


def stale_why(cell, evo) -> str:
    """Why a baseline cell no longer fits its seed's EvoTrainer cell (`evo`, None while not done), in compare's
    words ('' when it fits): compare sets such a cell aside and computes it again. The search's trials are judged as
    long as the ones it ran (its budget's)."""
    from evotrainer.compare.execution import stale_reason

    if evo is None or cell.arm == "evotrainer":
        return ""
    return stale_reason(cell, evo.main_steps, evo.total_steps, cell.search.trial_steps if cell.search else 0)


def status(out: Path, domain: str, names: list[str], seeds: int) -> str:
    """`--status`: what a benchmark spread over sittings has left, read from `OUT/<domain>-<name>/cells/` alone. A
    cell is done when its file is written; computing when a process holds its lock (`Compare.locked_cell`); to do
    otherwise. A baseline done but matched to other steps than its seed's EvoTrainer cell now has (main-line steps,
    or the search's trials) is stale: compare sets it aside and computes it again (`stale_reason`). Cells set aside
    (`<arm>-s<seed>.<TAG>.json`: `--again`, or `stale`) are listed by name."""
    from filelock import FileLock, Timeout

    from evotrainer.compare.results import Cell

    lines = [f"| harness | {' | '.join(f'{a} s{s}' for a in ARMS for s in range(seeds))} | set aside |",
             "|---|" + "---|" * (len(ARMS) * seeds + 1)]
    left = Counter()
    for name in names:
        cells = out / f"{domain}-{name}" / "cells"
        row = []
        evo = {s: Cell.model_validate_json(p.read_text()) for s in range(seeds)
               if (p := cells / f"evotrainer-s{s}.json").is_file()}
        for arm in ARMS:
            for s in range(seeds):
                cell = cells / f"{arm}-s{s}.json"
                if cell.is_file():
                    data = Cell.model_validate_json(cell.read_text())
                    why = stale_why(data, evo.get(s))
                    row.append(f"done ({data.main_steps} steps, {data.test_accuracy:.4f}"
                               f"{f', stale: {why}' if why else ''})")
                    left[arm] += bool(why)  # compare computes it again
                    continue
                left[arm] += 1
                lock = cell.with_suffix(".lock")
                try:  # a lock never taken cannot be held (and trying it would create it: status writes nothing)
                    with FileLock(lock, timeout=0) if lock.is_file() else nullcontext():
                        row.append("to do")
                except Timeout:
                    row.append("computing")
        aside = sorted(p.name for p in cells.glob("*-s*.*.json")) if cells.is_dir() else []
        lines.append(f"| {domain}/{name} | {' | '.join(row)} | {', '.join(aside) or '-'} |")
    return "\n".join(lines) + "\n\n" + time_left(left, cell_minutes(out, domain))


def cell_minutes(out: Path, domain: str) -> dict[str, list[float]]:
    """The wall minutes of every cell on record, per arm, in the domain's comparisons under OUT (set-aside cells,
    `<arm>-s<seed>.<TAG>.json`, are not on record)."""
    minutes: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for arm in ARMS:
        for path in out.glob(f"{domain}-*/cells/{arm}-s*.json"):
            if re.fullmatch(rf"{arm}-s\d+\.json", path.name):
                minutes[arm].append(json.loads(path.read_text())["wall_seconds"] / 60)
    return minutes


def time_left(left: Counter, minutes: dict[str, list[float]]) -> str:
    """`--status`'s last line: the cells left (to do, computing or stale) and about how long they take one at a
    time, each at the median wall time its arm's cells on record took in this domain (on this machine, under its load
    then: an estimate, not a promise)."""
    arms = [arm for arm in ARMS if left[arm]]
    if not arms:
        return "Left: nothing, every cell is done."
    text = (f"Left: {sum(left.values())} cells ({', '.join(f'{arm} {left[arm]}' for arm in arms)}; a cell computing "
            "counted whole).")
    timed = {arm: float(np.median(minutes[arm])) for arm in arms if minutes[arm]}
    if not timed:
        return text + " No cell of their arms is on record to time them."
    each = ", ".join(f"{arm} {timed[arm]:.0f} min from {len(minutes[arm])}" for arm in timed)
    hours = sum(left[arm] * timed[arm] for arm in timed) / 60
    text += f" One at a time, at the median wall time of the domain's cells on record ({each}): about {hours:.1f} h"
    untimed = [arm for arm in arms if arm not in timed]
    return text + (f", plus the {sum(left[arm] for arm in untimed)} cells of {', '.join(untimed)}, with no cell of "
                   "their arm on record to time them." if untimed else ".")


def harness_row(domain: str, name: str, harness: Path, out: Path, seeds: int, budget: str, jobs: int = 1) -> dict:
    from evotrainer.compare import compare
    from evotrainer.compare.results import Comparison

    analyzers = [a for a, _ in defects_of(harness)] if name != "clean" else []
    cmp_dir = out / f"{domain}-{name}"
    started = time.time()
    done = threading.Event()
    watcher = threading.Thread(target=keep_evidence_checks, args=(cmp_dir, seeds, harness, analyzers, done),
                               daemon=True)
    watcher.start()
    try:
        comparison: Comparison = compare(cmp_dir, domain if name == "clean" else None, seeds, ARMS, budget, None,
                                         f"python benchmarks/repair.py --domain {domain} --only {name}",
                                         harness=None if name == "clean" else harness, jobs=jobs)
    finally:
        done.set()
        watcher.join()
    return row_of(domain, name, harness, cmp_dir, comparison.cells, comparison.seeds, comparison.harness_digest) \
        | {"seconds": round(time.time() - started)}


def row_of(domain: str, name: str, harness: Path, cmp_dir: Path, cells: list, seeds: list[int], digest: str | None,
           kept_only: bool = False) -> dict:
    """A harness's row from its finished cells (every arm of every seed, seed by seed) and the evidence checks of
    each seed (`evidence_checks`; `kept_only`: only what is kept beside the cells)."""
    from evotrainer.compare.report import search_effect_of
    from evotrainer.compare.results import summarize

    defects = defects_of(harness) if name != "clean" else []
    analyzers = [a for a, _ in defects]
    by = {(c.arm, c.seed): c for c in cells}
    seeds_rows = []
    for s in seeds:
        evo, ref = by[("evotrainer", s)], by[("reference", s)]
        checks = evidence_checks(cmp_dir, s, harness, analyzers, kept_only=kept_only)
        per_defect = []
        for analyzer, transform in defects:
            tests = [v for v in evo.lineage if v["transform"] == transform]
            promoted = [v for v in tests if v["decision"] == "promote"]
            silent_after, ref_fires = checks[analyzer]
            per_defect.append({"analyzer": analyzer, "repair": transform,
                               "repaired": bool(promoted) and bool(silent_after),
                               "generation": promoted[0]["generation"] if promoted else None,
                               "analyzer_silent_at_end": silent_after, "reference_analyzer_fires": ref_fires,
                               "tests": [{k: v.get(k) for k in TEST_KEYS} for v in tests]})
        seeds_rows.append({"seed": s, "defects": per_defect,
                           "invalid": sum(p.get("invalid", False) for p in evo.promotions),
                           "evotrainer": evo.test_accuracy, "reference": ref.test_accuracy,
                           "steps": {a: by[(a, s)].total_steps for a in ARMS}})
    summary = {x.arm: x for x in summarize(cells, ARMS)}
    return {"harness": name, "domain": domain, "defects": [{"analyzer": a, "repair": t} for a, t in defects],
            "digest": digest, "seeds": seeds_rows,
            "evotrainer": summary["evotrainer"].test_accuracy, "reference": summary["reference"].test_accuracy,
            "hpo": summary["hpo"].test_accuracy, "vs_reference": summary["evotrainer"].vs_reference,
            "vs_hpo": (search_effect_of(cells, seeds) or [None])[:3]}


@functools.cache
def shipped_start(domain: str) -> str | None:
    """The weights (`weights_digest`) of the warm policy the package ships for the domain's default configuration,
    which every arm of a comparison starts from; None where it ships none. Read once a domain (every harness of a
    table asks)."""
    from evotrainer.trainer.policy import SHIPPED, cache_key, default_configs, weights_digest

    policy = SHIPPED / cache_key(domain, 0, *default_configs(domain))
    return weights_digest(policy) if (policy / "meta.json").is_file() else None


def on_record(out: Path, domain: str, name: str, seeds: int) -> tuple[dict | None, str]:
    """`--table`: a harness's row from what is on record in `OUT/<domain>-<name>/` alone (its cells and the evidence
    kept beside them), or, while not all of its cells are done or one is stale, None and what is left. Nothing is
    computed or written. A record of another harness than the one in `benchmarks/flawed/` now (its digest, as
    `compare` refuses to resume it), or started from other weights than the policy the package ships, is named, not
    counted; one recorded before comparisons kept their start weights is counted and marked (`start_weights: None`)."""
    from evotrainer.compare.results import Cell, cells_on_record
    from evotrainer.workspaces.source import starting_harness

    cmp_dir = out / f"{domain}-{name}"
    record = cells_on_record(cmp_dir / "cells") if (cmp_dir / "cells").is_dir() else {}
    cells = {k: Cell.model_validate(v) for k, v in record.items() if k[0] in ARMS and k[1] < seeds}
    todo = [f"{a}-s{s}" for a in ARMS for s in range(seeds) if (a, s) not in cells]
    stale = [f"{a}-s{s}" for (a, s), c in sorted(cells.items()) if stale_why(c, cells.get(("evotrainer", s)))]
    if todo or stale:
        done = len(ARMS) * seeds - len(todo) - len(stale)
        return None, (f"{domain}/{name}: {done} of {len(ARMS) * seeds} cells done"
                      + (f", {', '.join(stale)} stale" if stale else "")
                      + (f", {', '.join(todo)} to do" if todo and done else ""))
    if not (cmp_dir / "request.json").is_file():
        return None, f"{domain}/{name}: no request.json beside its cells (what they were computed for is unknown)"
    request = json.loads((cmp_dir / "request.json").read_text())
    harness = starting_harness(domain) if name == "clean" else starting_harness(None, FLAWED / domain / name)
    if name != "clean" and request.get("harness") != harness.digest:
        return None, (f"{domain}/{name}: its cells were computed for harness {request.get('harness')}, which is "
                      f"{harness.digest} now")
    shipped, weights = shipped_start(domain), request.get("start_weights")
    if weights is not None and shipped is not None and weights != shipped:
        return None, (f"{domain}/{name}: its cells started from weights {weights}, the package ships "
                      f"{shipped}")
    order = sorted(cells.values(), key=lambda c: (c.seed, ARMS.index(c.arm)))  # as compare returns them
    return row_of(domain, name, FLAWED / domain / name, cmp_dir, order, list(range(seeds)), harness.digest,
                  kept_only=True) | {"start_weights": weights}, ""


def _unknown(pairs: list[dict], note: str = "") -> str:
    """How many promoted repairs could not be checked (the champion's last evidence unreadable): counted as not
    repaired, and said."""
    n = sum(1 for x in pairs if x["generation"] is not None and x.get("analyzer_silent_at_end", False) is None)
    return f" ({n} promoted, evidence unreadable{note})" if n else ""


def label(row: dict, mixed: bool) -> str:
    """A row's harness, named with its domain where a table holds more than one; marked * where its start weights
    were not recorded (`on_record`)."""
    name = f"{row['domain']}/{row['harness']}" if mixed else row["harness"]
    return name + ("*" if "start_weights" in row and row["start_weights"] is None else "")


def table(rows: list[dict]) -> str:
    lines = ["| harness | defect: evidence -> repair | repaired (seeds) | generation | reference still shows it | "
             "sealed test EvoTrainer / reference / hpo | EvoTrainer - reference [95%] | EvoTrainer - hpo [95%] | "
             "steps a seed (evo/ref/hpo) | invalid |", "|---|---|---|---|---|---|---|---|---|---|"]
    mixed = len({r.get("domain") for r in rows}) > 1
    for r in rows:
        s = r["seeds"]
        per = [[x["defects"][k] for x in s] for k in range(len(r["defects"]))]  # per defect, its seeds
        defects = "; ".join(f"`{d['analyzer']}` -> `{d['repair']}`" for d in r["defects"]) or "-"
        repaired = "; ".join(f"{sum(x['repaired'] for x in d)}/{len(d)}" + _unknown(d) for d in per) or "-"
        gens = "; ".join(", ".join(str(x["generation"]) if x["repaired"] else f"({x['generation']})"
                                   for x in d if x["generation"] is not None) or "-" for d in per) or "-"
        ref = "; ".join(f"{sum(bool(x['reference_analyzer_fires']) for x in d)}/{len(d)}" for d in per) or "-"
        d, lo, hi = r["vs_reference"] or (float("nan"),) * 3
        h = r["vs_hpo"] if r["vs_hpo"] and r["vs_hpo"][0] is not None else None
        vs_hpo = f"{h[0]:+.3f} [{h[1]:+.3f}, {h[2]:+.3f}]" if h else "-"
        steps = "/".join(f"{np.mean([x['steps'][a] for x in s]):.0f}" for a in ARMS)
        lines.append(f"| {label(r, mixed)} | {defects} | {repaired} | {gens} | {ref} | "
                     f"{r['evotrainer']:.3f} / {r['reference']:.3f} / {r['hpo']:.3f} | "
                     f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}] | {vs_hpo} | "
                     f"{steps} | {sum(x['invalid'] for x in s)} |")
    pairs = [d for r in rows for x in r["seeds"] for d in x["defects"]]
    flawed = [r for r in rows if r["defects"]]
    wins = sum(1 for r in flawed if r["vs_reference"] and r["vs_reference"][1] > 0)
    lines += ["", "A harness with two defects has one entry per defect in the defect, repaired, generation and "
                  "reference columns, in the order of its README. A generation in parentheses: the repair was "
                  "promoted then but is not counted as repaired, its analyzer still firing at the end of the "
                  "champion's line (or that evidence unreadable, as the repaired column says)."
              + (" *: computed before comparisons recorded the weights their arms start from (6f613c8), so not "
                 "checked against the policy the package ships." if any("start_weights" in r and
                                                                           r["start_weights"] is None for r in rows)
                 else ""), "",
              f"Defects repaired in {sum(x['repaired'] for x in pairs)} of {len(pairs)} (defect, seed) pairs"
              f"{_unknown(pairs, ', not counted')}; "
              f"EvoTrainer above the reference with the interval's lower bound > 0 on {wins} of {len(flawed)} "
              f"flawed harnesses; invalid promotions: {sum(x['invalid'] for r in flawed for x in r['seeds'])}."]
    return "\n".join(lines)


def tests_table(rows: list[dict]) -> str:
    """Every test of a defect's repair, one line each (harness, defect, seed, generation), and what the tests made
    while the defect stood add up to: how many were promoted, rejected on their measurement, blocked by a gate, or
    inconclusive, and how many of the inconclusive measured a gain the test was too weak to see (0 < effect < its
    minimum detectable effect). What the Critic found the candidate repaired (a gate the champion failed) or fixed (a
    plain defect) is named: the rule promotes those unless shown, or measured, harmful (`agents/critic.py`). A test
    after the repair was promoted on that line applies it a second time: listed, marked, and not counted."""
    lines = ["| harness | repair | seed | generation | dev effect [95%] | MDE | P(gain) | decision |",
             "|---|---|---|---|---|---|---|---|"]
    tests, again = [], 0
    mixed = len({r.get("domain") for r in rows}) > 1
    for r in rows:
        for x in r["seeds"]:
            for d in x["defects"]:
                for t in d.get("tests", []):
                    second = d["generation"] is not None and t["generation"] > d["generation"]
                    again += second
                    tests += [] if second else [t]
                    gates = ", ".join(t["failed_gates"] or [])
                    effect = ("-" if t["effect"] is None else
                              f"{t['effect']:+.3f} [{t['ci_low']:+.3f}, {t['ci_high']:+.3f}]")
                    lines.append(f"| {label(r, mixed)} | `{d['repair']}` | {x['seed']} | {t['generation']} | "
                                 f"{effect} | "
                                 + ("-" if t["mde"] is None else f"{t['mde']:.3f}") + " | "
                                 + ("-" if t["p_gain"] is None else f"{t['p_gain']:.2f}") + " | "
                                 + t["decision"] + (f" ({gates})" if gates else "")
                                 + "".join(f"; {what} {', '.join(f'`{k}`' for k in t.get(key) or [])}"
                                           for key, what in (("repairs", "repairs"), ("fixes", "fixes"))
                                           if t.get(key))
                                 + (", applied again after its promotion" if second else "") + " |")
    if len(lines) == 2:
        return "No test of a defect's repair yet."

    def kind(t: dict) -> str:
        if t["decision"] in ("promote", "inconclusive"):
            return t["decision"]
        if t["failed_gates"]:
            return "gate"
        return "measured" if t["decision"] == "reject" and t["effect"] is not None else "other"

    count = Counter(kind(t) for t in tests)
    unseen = [t for t in tests if kind(t) == "inconclusive" and t["effect"] is not None and t["mde"] is not None
              and 0 < t["effect"] < t["mde"]]
    mdes = [t["mde"] for t in tests if t["mde"] is not None]
    lines += ["", f"{len(tests)} tests of a defect's repair while the defect stood: {count['promote']} promoted, "
                  f"{count['measured']} rejected on their measurement, {count['gate']} blocked by a gate, "
                  f"{count['inconclusive']} inconclusive ({len(unseen)} of them a gain below the test's minimum "
                  "detectable effect)" + (f", {count['other']} decided without a measurement" if count["other"] else "")
                  + (f"; median MDE {np.median(mdes):.3f}" if mdes else "")
                  + (f". {again} more applied a promoted repair again (not counted)." if again else ".")]
    return "\n".join(lines)


MARKERS = ("<!-- repair.py --table -->", "<!-- /repair.py --table -->")


def record_table(out: Path, chosen: list[tuple[str, str]], seeds: int) -> str:
    """`--table`: the table and every test of a repair, of the harnesses whose cells are all on record and current
    (`on_record`), then the others named with what they have left."""
    found = [on_record(out, d, n, seeds) for d, n in chosen]
    rows = [r for r, _ in found if r is not None]
    left = [why for r, why in found if r is None]
    return ((table(rows) + "\n\nEvery test of a defect's repair:\n\n" + tests_table(rows) if rows else
             "No harness has all its cells done.")
            + ("\n\nNot in the table:\n" + "\n".join(f"- {w}" for w in left)
               if left else ""))


def marked_lines(doc: str) -> tuple[list[str], int, int]:
    """The document's lines and the indices of its two `MARKERS` lines (each alone on its line, once, the first
    before the second); ValueError saying which is wrong otherwise."""
    lines = doc.splitlines(keepends=True)
    at = [[i for i, line in enumerate(lines) if line.strip() == m] for m in MARKERS]
    for m, found in zip(MARKERS, at):
        if len(found) != 1:
            raise ValueError(f"{'no' if not found else len(found)} lines {m}: one is needed")
    if at[0][0] > at[1][0]:
        raise ValueError(f"{MARKERS[1]} comes before {MARKERS[0]}")
    return lines, at[0][0], at[1][0]


def between_markers(doc: str) -> str:
    """What lies between the two `MARKERS` lines, stripped."""
    lines, begin, end = marked_lines(doc)
    return "".join(lines[begin + 1:end]).strip()


def write_between_markers(path: Path, text: str) -> None:
    """Replace what lies between the file's two `MARKERS` lines by `text`, atomically; a file without them (or with
    either twice, or in the wrong order) is one clear error and is left as it was."""
    try:
        lines, begin, end = marked_lines(path.read_text() if path.is_file() else "")
    except ValueError as e:
        sys.exit(f"error: {path}: {e}; to write the table between them, put each alone on its line where the table "
                 "goes")
    atomic_write_text(path, "".join(lines[:begin + 1]) + "\n" + text + "\n\n" + "".join(lines[end:]))


def selected(domain: str, only: str, clean: bool) -> list[tuple[str, str]]:
    """The (domain, harness) pairs a command names: every flawed harness of the domain (of each domain for `all`),
    those of `--only` alone (a name in each domain that has it), the template first where `--clean` (or `--only
    clean`) asks for it. An unknown domain or name is one clear error."""
    if domain not in (*DOMAINS, "all"):
        sys.exit(f"error: --domain {domain!r}: choose from all, {', '.join(DOMAINS)}")
    domains = list(DOMAINS) if domain == "all" else [domain]
    names = {d: sorted(p.parent.name for p in (FLAWED / d).glob("*/harness.yaml")) for d in domains}
    wanted = only.split(",") if only else []
    unknown = sorted(set(wanted) - {n for d in domains for n in names[d]} - {"clean"})
    if unknown:
        sys.exit(f"error: no flawed {'' if domain == 'all' else domain + ' '}harness {unknown[0]!r}: choose from "
                 + ", ".join(f"{d}/{n}" if domain == "all" else n for d in domains for n in names[d]))
    clean = clean or "clean" in wanted
    flawed = set(wanted) - {"clean"}
    domains = [d for d in domains if not flawed or flawed & set(names[d])]  # the template of a domain named
    return [(d, n) for d in domains for n in (["clean"] if clean else []) + names[d] if not wanted or n in wanted
            or n == "clean"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--domain", default="all", help="all (default), math, code or swe")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path.home() / "evotrainer-repair")
    ap.add_argument("--only", default="", help="comma-separated harness names (default: all of the domain)")
    ap.add_argument("--budget", default="default")
    ap.add_argument("--clean", action="store_true", help="also the domain's template (nothing to repair)")
    ap.add_argument("--jobs", type=int, default=1, help="cells at a time, each in its own process (compare --jobs)")
    ap.add_argument("--again", metavar="TAG", default="",
                    help="compute the EvoTrainer cells on record again (after a change to the loop), setting each "
                         "aside once as cells/evotrainer-s<seed>.TAG.json; the baselines are reused where they fit")
    ap.add_argument("--status", action="store_true", help="compute nothing: which cells are done, computing, left")
    ap.add_argument("--table", action="store_true",
                    help="compute nothing: the table of every harness whose cells are all done, from the record")
    ap.add_argument("--into", type=Path, help="with --table: write it between the markers of this file")
    args = ap.parse_args()
    if args.again and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", args.again):
        sys.exit(f"error: --again {args.again!r}: a tag of letters, digits, '-' and '_' (it names files)")
    if args.into and not args.table:
        sys.exit("error: --into FILE writes the table of --table: add --table")
    if args.again and (args.table or args.status):
        sys.exit("error: --again computes cells again; --table and --status compute nothing: drop one")
    apply_offline_switches()
    chosen = selected(args.domain, args.only, args.clean)
    if args.status:
        print("\n\n".join(status(args.out, d, [n for dd, n in chosen if dd == d], args.seeds)
                          for d in dict.fromkeys(d for d, _ in chosen)))
        return
    if args.table:
        text = record_table(args.out, chosen, args.seeds)
        if args.into:
            write_between_markers(args.into, text)
        else:
            print(text)
        return
    rows = []
    for domain, name in chosen:
        print(f"> {domain}/{name}", flush=True)
        if args.again and (moved := set_aside_loop_cells(args.out / f"{domain}-{name}", args.seeds, args.again)):
            print(f"  EvoTrainer cells of seeds {moved} set aside as *.{args.again}.json: computed again", flush=True)
        rows.append(harness_row(domain, name, FLAWED / domain / name, args.out, args.seeds, args.budget, args.jobs))
        (args.out / "repair.json").write_text(json.dumps(rows, indent=1))
        (args.out / "repair.md").write_text(f"# Repair benchmark: {args.domain}\n\nCommand: `python "
                                            f"{' '.join(sys.argv)}`\n\n" + table(rows) + "\n\n## Every test of a "
                                            "defect's repair\n\n" + tests_table(rows) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
