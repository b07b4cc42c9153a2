"""Running a comparison: every (arm, seed) cell computed once and written when done, so a rerun of the same
command resumes at the first missing cell; the request checked before anything is written."""

from __future__ import annotations

import json
import resource
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import numpy as np

from evotrainer.base.errors import UserError
from evotrainer.base.files import atomic_write_text, set_aside, writable_dir
from evotrainer.compare.arms import (
    ARMS,
    BUDGETS,
    DEFAULT_ARMS,
    DOMAINS,
    LLM_ARMS,
    LOOPS,
    SEARCHES,
    CompareBudget,
    budget_for,
    line_steps,
    static_harness,
)
from evotrainer.compare.hpo import trial_count
from evotrainer.compare.report import write_report
from evotrainer.compare.results import Cell, Comparison, summarize
from evotrainer.workspaces.source import StartingHarness

POLL_S = 2.0  # how often a process whose remaining cells are all held by others looks again


def _cpu() -> float:
    """CPU seconds of this process and its children: those that ran in bubblewrap report their own at their end."""
    from evotrainer.trainer.sandbox import isolated_cpu_seconds

    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime + isolated_cpu_seconds()



class Compare:
    """One comparison directory: cells computed in order, each once."""

    def __init__(self, out: Path, harness: StartingHarness, seeds: list[int], arms: list[str], budget: CompareBudget,
                 budget_name: str, checkpoint: Path, command: str, status: Callable[[str], None] | None = None,
                 meta_llm: str = "local", api_base: str | None = None):
        self.out, self.harness, self.domain, self.seeds, self.arms = out, harness, harness.domain, seeds, arms
        self.budget, self.budget_name, self.start, self.command = budget, budget_name, checkpoint, command
        self.status = status or (lambda text: None)
        self.meta_llm, self.api_base = meta_llm, api_base  # the agents of the LLM_ARMS

    def loop_config(self):
        from evotrainer.base.config import loop_config

        return loop_config(self.domain, self.budget.loop_overrides())

    def horizon(self) -> int:
        """The loop arms' main-line horizon: a static arm trains on the same one."""
        return self.loop_config().horizon(self.budget.generations)

    def cell_path(self, arm: str, seed: int) -> Path:
        return self.out / "cells" / f"{arm}-s{seed}.json"

    def cell(self, arm: str, seed: int, main_steps: int, total_steps: int | None = None) -> Cell:
        """The (arm, seed) cell, computed once. A static arm trains `main_steps`; a search arm spends at most
        `total_steps` (the EvoTrainer cell's) with its chosen recipe trained for `main_steps`."""
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
            repairs = {v["branch"] for v in cell.lineage if v.get("repairs") and v["decision"] == "promote"}
            if any("against" not in p or (p["branch"] in repairs and "repairs" not in p)
                   for p in cell.promotions) or any("mde" not in v for v in cell.lineage):
                # written before promotions were measured against the control arm (a repair's against its start),
                # or the lineage kept the MDE
                cell = cell.model_copy(update=self._remeasure(arm, seed))
                atomic_write_text(path, cell.model_dump_json(indent=1))
            stale = self._stale(cell, main_steps, total_steps)
            if not stale:
                return cell
            # matched to an EvoTrainer cell that has since been computed again: kept beside, computed anew
            path.replace(set_aside(path, path.with_suffix(".stale.json")))
            self.status(f"{arm} seed {seed}: the cell on record {stale}: computed again")
        self.status(f"{arm} seed {seed}")
        started, cpu = time.time(), _cpu()
        if arm in LOOPS:
            cell = self._loop(arm, seed)
        elif arm in SEARCHES:
            cell = self._hpo(seed, main_steps, total_steps)
        else:
            cell = self._static(arm, seed, main_steps)
        cell = cell.model_copy(update={"cpu_seconds": round(_cpu() - cpu, 1),
                                       "wall_seconds": round(time.time() - started, 1)})
        atomic_write_text(path, cell.model_dump_json(indent=1))
        return cell

    def trial_steps(self, main_steps: int) -> int:
        return min(self.budget.hpo_trial_steps or self.loop_config().train_steps, main_steps)

    def _stale(self, cell: Cell, main_steps: int, total_steps: int | None) -> str:
        return stale_reason(cell, main_steps, total_steps, self.trial_steps(main_steps))

    def _test(self, checkpoint: Path, seed: int, work: Path, k: int | None = None):
        from evotrainer.trainer import jobs

        return jobs.evaluate(checkpoint, self.domain, "test", work, k=self.budget.k if k is None else k,
                             limit=self.budget.test_items, seed=seed)

    def _static(self, arm: str, seed: int, steps: int) -> Cell:
        from evotrainer.trainer import jobs
        from evotrainer.trainer.grpo import TrainSpec

        harness = static_harness(self.harness, arm, self.out / "harnesses" / arm)
        work = self.out / "static" / f"{arm}-s{seed}"
        ckpt = work / "checkpoints" / "policy"
        if (ckpt / "meta.json").is_file() and (had := line_steps(ckpt, self.start)) != steps:
            work.rename(set_aside(work, work.with_name(f"{work.name}-{had}steps")))  # a stale cell's training
        if not (ckpt / "meta.json").is_file():
            # the loop's main line of the same seed, never evolved: its horizon (schedule, data order), at once
            spec = TrainSpec(domain=self.domain, checkpoint=str(self.start), harness_dir=str(harness), steps=steps,
                             seed=seed, horizon=max(self.horizon(), steps), out_dir=str(work), checkpoint_id="policy",
                             checkpoints_dir=str(work / "checkpoints"), evidence_dir=str(work / "evidence"),
                             run=f"compare-{arm}", harness_commit=f"static:{arm}",
                             result_path=str(work / "specs" / "train.result.json"))
            jobs.train(spec, work)
        ev = self._test(ckpt, seed, work)
        return Cell(arm=arm, seed=seed, checkpoint=str(ckpt), main_steps=line_steps(ckpt, self.start),
                    total_steps=steps, cpu_seconds=0, wall_seconds=0, test_accuracy=ev.accuracy,
                    test_avg_at_k=ev.avg_at_k, item_ids=ev.item_ids, greedy_correct=ev.greedy_correct, k=ev.k,
                    sampled_correct=ev.sampled_correct)

    def _hpo(self, seed: int, main_steps: int, total_steps: int | None) -> Cell:
        from evotrainer.compare.hpo import run_search

        if total_steps is None:
            raise UserError("the hpo arm spends the EvoTrainer arm's compute: add evotrainer to --arms")
        loop = self.loop_config()
        ckpt, search = run_search(self.harness, self.start, self.out / "hpo" / f"s{seed}", seed=seed,
                                  total_steps=total_steps, main_steps=main_steps,
                                  trial_steps=self.trial_steps(main_steps),
                                  horizon=max(self.horizon(), main_steps), dev_items=loop.backtest.dev_items)
        ev = self._test(ckpt, seed, ckpt.parent.parent)
        return Cell(arm="hpo", seed=seed, checkpoint=str(ckpt), main_steps=line_steps(ckpt, self.start),
                    total_steps=search.steps(main_steps), cpu_seconds=0, wall_seconds=0, test_accuracy=ev.accuracy,
                    test_avg_at_k=ev.avg_at_k, item_ids=ev.item_ids, greedy_correct=ev.greedy_correct, k=ev.k,
                    sampled_correct=ev.sampled_correct, search=search)

    def _loop(self, arm: str, seed: int) -> Cell:
        from evotrainer.agents.meta_policy import connect
        from evotrainer.graph.build import drive, open_run
        from evotrainer.report import write_report as write_run_report
        from evotrainer.workspaces.run import RunWorkspace

        b = self.budget
        run_dir = self.out / "runs" / f"{arm}-s{seed}"
        meta_llm, api_base = (self.meta_llm, self.api_base) if arm in LLM_ARMS else ("offline", None)
        policy = connect(meta_llm, api_base)  # before the run exists: an unreachable model is one clear error
        if (run_dir / "run.yaml").is_file():
            ws = RunWorkspace.open(run_dir)
        else:
            # every run its own skill memory: seeds stay independent, and no arm learns from another
            skills = own_memory(self.out / "skills" / f"{arm}-s{seed}")
            ws = open_run(run_dir, domain=self.domain, budget={"generations": b.generations,
                                                               "candidates": b.candidates},
                          meta_llm=meta_llm, api_base=api_base, skills=str(skills),
                          checkpoint=str(self.start), seed=seed, loop_overrides={**b.loop_overrides(), **LOOPS[arm]},
                          harness=None if self.harness.template else self.harness)
        summary = drive(ws, policy, fresh=None)  # a run interrupted earlier resumes
        if not summary.finished:
            raise UserError(f"the {arm} run of seed {seed} stopped before its end ({summary.stop_reason}): rerun the "
                            "same compare command to resume it")
        with suppress(UserError, OSError):  # the run's own page, linked from the comparison's report; not needed by it
            write_run_report(ws.path)
        ckpt = ws.champion_checkpoint() or self.start
        ev = self._test(ckpt, seed, run_dir)
        lineage, promotions = self._lineage(ws), self._promotions(ws, summary, seed)
        return Cell(arm=arm, seed=seed, checkpoint=str(ckpt), main_steps=line_steps(ckpt, self.start),
                    total_steps=summary.steps_used, cpu_seconds=0, wall_seconds=0, test_accuracy=ev.accuracy,
                    test_avg_at_k=ev.avg_at_k, item_ids=ev.item_ids, greedy_correct=ev.greedy_correct, k=ev.k,
                    sampled_correct=ev.sampled_correct, promotions=promotions, lineage=lineage)

    def _remeasure(self, arm: str, seed: int) -> dict:
        """A finished loop cell's promotions and lineage read again from its run (done: nothing trains)."""
        from evotrainer.agents.offline.policy import OfflinePolicy
        from evotrainer.graph.build import drive
        from evotrainer.workspaces.run import RunWorkspace

        ws = RunWorkspace.open(self.out / "runs" / f"{arm}-s{seed}")
        return {"promotions": self._promotions(ws, drive(ws, OfflinePolicy(), fresh=None), seed),
                "lineage": self._lineage(ws)}

    @staticmethod
    def _lineage(ws) -> list[dict]:
        from evotrainer.agents.schemas import VerdictRecord

        out = []
        for r in ws.harness.lineage():
            v = VerdictRecord.load(ws.verdict_path(r.branch))
            if v is None:
                continue
            out.append({"generation": r.generation, "branch": r.branch, "transform": v.transform,
                        "decision": v.decision, "effect": v.effect, "ci_low": v.ci_low, "ci_high": v.ci_high,
                        "mde": v.mde, "p_gain": v.p_gain, "failed_gates": v.failed_gates, "repairs": v.repairs,
                        **({"fixes": v.fixes} if v.fixes else {})})
        return out

    def _promotion(self, ws, h, seed: int, next_trained: str | None = None) -> dict:
        """The promoted harness's effect on the sealed test against what the main line would have been without it:
        the policy it handed on against the generation's control arm of the same seed, start and steps (the
        champion harness). A replay-only promotion hands on the trained champion itself, so its harness is judged
        by the next generation's training against that champion. A repair of a gate the champion failed is judged
        as the Critic judged it (validity first): measured against the policy both arms started from, its cost
        against the control (whose harness it replaced for failing the gate) kept beside as `vs_control`, and
        invalid only when shown worse than both."""
        from evotrainer.agents.schemas import VerdictRecord

        g = h.generation
        trained = Path(h.trained or ws.path / "checkpoints" / f"g{g}-train" / "checkpoints" / "policy")
        after = Path(h.checkpoint)
        before, against, start = None, "control", None
        if after.resolve() == trained.resolve():  # the next generation's segment, trained under the new harness
            before, against = trained, "champion"
            after = Path(next_trained or ws.path / "checkpoints" / f"g{g + 1}-train" / "checkpoints" / "policy")
        elif (after / "meta.json").is_file():
            meta = json.loads((after / "meta.json").read_text())
            start = Path(meta["parent"]) if meta.get("parent") else None
            suffix = after.parent.parent.name.split("-", 1)[-1]  # s<seed>-k<steps> of the promoted arm
            for ctrl in sorted((ws.path / "backtests" / f"g{g}" / "control").glob(f"*-{suffix}/checkpoints/policy")):
                m = json.loads((ctrl / "meta.json").read_text()) if (ctrl / "meta.json").is_file() else {}
                if m.get("parent") == meta.get("parent") and m.get("steps") == meta.get("steps"):
                    before = ctrl
        verdict = VerdictRecord.load(ws.verdict_path(h.promoted)) if h.promoted else None
        repairs = list(verdict.repairs) if verdict is not None and against == "control" else []
        record = {"generation": g, "branch": h.promoted, "before": str(before), "after": str(after),
                  "against": against, **({"repairs": repairs} if repairs else {})}
        if before is None or not (after / "config.json").is_file():
            return {**record, "measured": False, "invalid": False}
        b = self._test(after, seed, ws.path, k=0)
        effect = self._effect(self._test(before, seed, ws.path, k=0), b)
        if repairs and start is not None and (start / "config.json").is_file():
            vs_start = self._effect(self._test(start, seed, ws.path, k=0), b)
            return {**record, "before": str(start), "against": "start", "vs_control": effect,
                    **vs_start, "invalid": vs_start["invalid"] and effect["invalid"]}
        return {**record, **effect}

    @staticmethod
    def _effect(a, b) -> dict:
        """Policy b minus policy a on the same sealed test items, paired; invalid when the interval is below zero."""
        from evotrainer.trainer.backtest.statistics import paired_bootstrap

        diffs = np.array([b.greedy_correct], dtype=float) - np.array([a.greedy_correct], dtype=float)
        d, lo, hi, _ = paired_bootstrap(diffs, 1000)
        return {"measured": True, "test_before": a.accuracy, "test_after": b.accuracy, "delta": d, "ci": [lo, hi],
                "invalid": hi < 0}

    def _promotions(self, ws, summary, seed: int) -> list[dict]:
        out = []
        for i, h in enumerate(summary.history):
            if h.promoted:
                nxt = summary.history[i + 1].trained if i + 1 < len(summary.history) else None
                out.append(self._promotion(ws, h, seed, nxt))
        return out

    def locked_cell(self, arm: str, seed: int, main_steps: int, total_steps: int | None = None, *,
                    wait: bool) -> Cell | None:
        """`cell` under the cell's file lock, so that several processes running the same command share the cells
        (each takes the next free one); without `wait`, None when another process holds it."""
        from filelock import FileLock, Timeout

        path = self.cell_path(arm, seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with FileLock(path.with_suffix(".lock"), timeout=-1 if wait else 0):
                return self.cell(arm, seed, main_steps, total_steps)
        except Timeout:
            return None

    def _pass(self, done: dict[tuple[str, int], Cell]) -> None:
        """One pass over the cells not in `done`: each one no other process holds is computed (or read) and added.
        A seed's EvoTrainer cell comes before its other arms' (they match its steps). The long arms go first, every
        seed's EvoTrainer cell, then the other loops' and the search's, the static recipes' last: with the short
        cells at the end, processes sharing a comparison finish together instead of one training the last long cell
        alone (seed by seed, the last seed's EvoTrainer cell ran while the other process had nothing to do)."""
        order = sorted(self.arms, key=lambda a: 0 if a == "evotrainer" else 1 if a in LOOPS or a in SEARCHES else 2)
        for arm in order:
            for seed in self.seeds:
                if (arm, seed) in done:
                    continue
                if arm == "evotrainer":
                    main, total = 0, None
                elif "evotrainer" in self.arms:
                    if (evo := done.get(("evotrainer", seed))) is None:
                        continue
                    main, total = evo.main_steps, evo.total_steps
                else:  # no EvoTrainer arm: the champion line's length without promotions
                    main, total = self.budget.generations * self.loop_config().train_steps, None
                if (cell := self.locked_cell(arm, seed, main, total, wait=False)) is not None:
                    done[(arm, seed)] = cell

    def cells(self) -> list[Cell]:
        """Every cell, seed by seed, EvoTrainer's first. Pass after pass (`_pass`), each computing every cell no
        other process holds; only when the rest are all held does this process wait, a poll at a time. (Waiting on
        the first held cell instead left a free one undone: a process blocked on another's `reference` cell while
        the `hpo` cell behind it waited for that same process, one core idle for half an hour of a benchmark.)"""
        done: dict[tuple[str, int], Cell] = {}
        while True:
            self._pass(done)
            if len(done) == len(self.arms) * len(self.seeds):
                arms = sorted(self.arms, key=lambda a: a != "evotrainer")  # EvoTrainer's first, then as given
                return [done[(arm, seed)] for seed in self.seeds for arm in arms]
            time.sleep(POLL_S)

    def run(self) -> Comparison:
        started = time.time()
        cells = self.cells()
        start = self._test(self.start, 0, self.out / "start")  # cached beside the checkpoint
        comparison = Comparison(domain=self.domain, harness=None if self.harness.template else str(self.harness.path),
                                harness_digest=self.harness.digest,
                                budget=self.budget, budget_name=self.budget_name,
                                seeds=self.seeds, arms=self.arms, start_checkpoint=str(self.start),
                                start_accuracy=start.accuracy, start_avg_at_k=start.avg_at_k,
                                command=self.command, wall_seconds=round(time.time() - started, 1),
                                summaries=summarize(cells, self.arms), cells=cells)
        write_report(comparison, self.out)
        return comparison



def own_memory(skills: Path) -> Path:
    """`skills`, empty, for a loop run about to start: a skill memory left there by a run that no longer exists (set
    aside by `repair.py --again`, or removed to compute its cell again) is moved aside to `<name>.orphan-<n>`, never
    read. Its lessons are that run's measurements of the same transforms on the same seed: read as a prior, they
    would change what the new run plans and what its Critic decides (the candidate ranked first, its P(gain) read
    under that prior), and the cell would no longer be one run from an empty memory."""
    if skills.exists():
        n = 1
        while (aside := skills.with_name(f"{skills.name}.orphan-{n}")).exists():
            n += 1
        skills.rename(aside)
    return skills


def check_request(out: Path, request: dict) -> None:
    """Record the request in `out`, refusing one that differs from the recorded one in anything but the number of
    seeds and where the starting harness was read from (its digest names it): more seeds extend a comparison (the
    cells of the first seeds are kept), other settings would mix arms measured differently. The start's weights,
    known only after the warm-up, are checked by `check_start`."""
    req = out / "request.json"
    loose = ("seeds", "harness_path", "start_weights")
    before = json.loads(req.read_text()) if req.is_file() else {}
    if before and {k: v for k, v in before.items() if k not in loose} != \
            {k: v for k, v in request.items() if k not in loose}:
        raise UserError(f"{out} holds a comparison with other settings ({req.read_text().strip()}): rerun it "
                        "with those (--seeds may grow), or choose a new directory")
    kept = {"start_weights": before["start_weights"]} if "start_weights" in before else {}
    atomic_write_text(req, json.dumps(request | kept))


def stale_reason(cell: Cell, main_steps: int, total_steps: int | None, trial_steps: int) -> str:
    """Why a cell on record no longer fits the EvoTrainer cell of its seed, which now has `main_steps` and
    `total_steps` ('' when it fits): a static arm trains as many main-line steps, the search spends as many GRPO
    steps (its number of trials of `trial_steps`)."""
    if cell.arm in LOOPS:
        return ""
    if cell.main_steps != main_steps:
        return f"trained {cell.main_steps} main-line steps, EvoTrainer's line now has {main_steps}"
    if cell.search is not None and total_steps is not None:
        trials = trial_count(total_steps, main_steps, trial_steps)
        if len(cell.search.trials) != trials:
            return f"ran {len(cell.search.trials)} trials, EvoTrainer's steps now pay for {trials}"
    return ""


def check_start(out: Path, start: Path, finished: bool) -> None:
    """Record the weights every arm starts from (`weights_digest`), refusing to compute more cells from others than
    the recorded cells were. A warm policy's cache key names its configuration, not its weights, and the warm-up is
    deterministic on one machine but not across CPUs: a comparison resumed elsewhere from its committed cells would
    pair arms that started from different policies. A `finished` comparison is only read (its report may be written
    again anywhere, nothing recorded); one recorded before this check is pinned by its first resume that computes."""
    from evotrainer.trainer.policy import weights_digest

    if finished:
        return
    req = out / "request.json"
    request = json.loads(req.read_text())
    weights = weights_digest(start)
    if request.get("start_weights", weights) != weights:
        raise UserError(f"{out}'s cells were computed from start weights {request['start_weights']}, but {start} "
                        f"holds {weights} (a warm policy built on another machine differs: the warm-up is not "
                        "bit-reproducible across CPUs): resume where they were computed, or with that machine's "
                        f"copy of {start}, or choose a new directory")
    if request.get("start_weights") != weights:
        atomic_write_text(req, json.dumps(request | {"start_weights": weights}))


@contextmanager
def side_workers(n: int, out: Path, args: list[str], status: Callable[[str], None]) -> Iterator[None]:
    """`n` more processes running the same comparison (`evotrainer compare ARGS --jobs 1`) beside this one: each
    takes the next cell no other process holds (`Compare.locked_cell`), so the cells run `n + 1` at a time. Each is a
    child of `sandbox.run_module` (its own session, the launcher's lifeline: if this process dies, they and their
    training children end too), run from a thread so that this process computes cells meanwhile. A worker that fails
    leaves its cell's lock free for the others; its log is `OUT/logs/worker-<i>.log`."""
    from evotrainer.trainer.sandbox import ChildResult, Limits, run_module

    # orchestrator code, not harness code: no isolation, the network as this process has it, limits that only stop a
    # runaway (each training child it starts gets its own)
    limits = Limits(timeout_s=30 * 24 * 3600, memory_mb=64_000, network=True)
    results: dict[int, ChildResult] = {}

    def work(i: int) -> None:
        results[i] = run_module("evotrainer.cli", [*args, "--jobs", "1", "--json"], cwd=Path.cwd(),
                                log_path=out / "logs" / f"worker-{i}.log", limits=limits, label=f"compare worker {i}")

    threads = [threading.Thread(target=work, args=(i,), name=f"compare-worker-{i}", daemon=True)
               for i in range(1, n + 1)]
    for t in threads:
        t.start()
    status(f"{n} more process{'es' if n > 1 else ''} share the cells (logs: {out / 'logs'}/worker-*.log)")
    yield  # on an exception this process ends, and its workers with it (their lifelines close)
    for i, t in enumerate(threads, 1):  # every cell is done: they are writing the same report and exiting
        t.join()
        res = results.get(i)
        if res is None or not res.ok:
            status(f"worker {i} failed ({res.message if res else 'no result'}): see {out / 'logs' / f'worker-{i}.log'}")


def _executor_args() -> list[str]:
    """This process's executor, for the side workers' command lines."""
    from evotrainer.trainer import executor

    ex = executor.current()
    address = getattr(ex, "address", None)
    return [] if ex.name == "local" else ["--executor", ex.name] + (["--ray-address", address] if address else [])


def compare(out: Path, domain: str | None, seeds: int, arms: list[str] | None, budget_name: str,
            checkpoint: Path | None, command: str, status: Callable[[str], None] | None = None,
            on_progress=None, harness: Path | None = None, jobs: int = 1, meta_llm: str = "local",
            api_base: str | None = None) -> Comparison:
    """Validate the request (one clear error, nothing written on bad input), then run or resume every cell, `jobs`
    at a time (`side_workers`). Every arm starts from `harness` (default: the domain's template); its domain is the
    comparison's. The LLM_ARMS are driven by `meta_llm` (at `api_base`)."""
    from evotrainer.trainer import jobs as trainer_jobs
    from evotrainer.workspaces.source import checked_harness

    if jobs < 1:
        raise UserError(f"--jobs {jobs}: at least 1 (cells computed at a time; one training core each)")
    if budget_name not in BUDGETS:
        raise UserError(f"unknown --budget {budget_name!r}: choose one of {', '.join(BUDGETS)}")
    arms = list(arms or DEFAULT_ARMS)
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise UserError(f"unknown arm {unknown[0]!r}: choose from {', '.join(ARMS)}")
    arms = [a for a in ARMS if a in arms]  # EvoTrainer first: the static arms match its main-line steps
    if any(a in SEARCHES for a in arms) and "evotrainer" not in arms:
        raise UserError("the hpo arm spends the EvoTrainer arm's compute of the same seed: add evotrainer to --arms")
    if checkpoint is not None and not (checkpoint / "config.json").is_file():
        raise UserError(f"checkpoint {checkpoint} not found or not a model directory (no config.json)")
    if harness is None and domain is None:
        domain = "math"
    if domain is not None and domain not in DOMAINS:
        raise UserError(f"compare supports --domain {', '.join(DOMAINS[:-1])} or {DOMAINS[-1]}, not {domain!r}")
    start_harness = checked_harness(domain, harness)  # its code too, in an isolated child: before anything is written
    if start_harness.domain not in DOMAINS:
        raise UserError(f"compare supports harnesses of {', '.join(DOMAINS[:-1])} or {DOMAINS[-1]}, not "
                        f"{start_harness.domain!r}")
    domain = start_harness.domain
    if any(a in LLM_ARMS for a in arms):  # an unreachable meta-LLM is one error before anything is written
        from evotrainer.agents.meta_policy import connect

        connect(meta_llm, api_base)
    out = writable_dir(out)
    request = {"domain": domain, "seeds": seeds, "arms": arms, "budget": budget_name,
               "checkpoint": str(checkpoint.resolve()) if checkpoint else None}
    if not start_harness.template:  # (a template comparison's request stays as it was recorded before --harness)
        request |= {"harness": start_harness.digest, "harness_path": str(start_harness.path)}
    if any(a in LLM_ARMS for a in arms):  # the model is part of what is compared: a resume may not change it
        request |= {"meta_llm": meta_llm, "api_base": api_base}
    check_request(out, request)
    start = checkpoint.resolve() if checkpoint else trainer_jobs.warm_policy(domain, 0, out, on_progress=on_progress)
    cmp = Compare(out, start_harness, list(range(seeds)), arms, budget_for(budget_name, domain), budget_name, start,
                  command, status, meta_llm=meta_llm, api_base=api_base)
    check_start(out, start, finished=all(cmp.cell_path(a, s).is_file() for a in arms for s in range(seeds)))
    if jobs == 1:
        return cmp.run()
    args = ["compare", "--domain", domain, "--seeds", str(seeds), "--arms", ",".join(arms), "--budget", budget_name,
            "--out", str(out)] + (["--harness", str(harness)] if harness else []) \
        + (["--checkpoint", str(checkpoint)] if checkpoint else []) \
        + (["--meta-llm", meta_llm] + (["--api-base", api_base] if api_base else [])
           if any(a in LLM_ARMS for a in arms) else []) + _executor_args()
    with side_workers(jobs - 1, out, args, cmp.status):
        cmp.run()
    return cmp.run()  # every cell is on disk: read again, and the report written last, by this process's command
