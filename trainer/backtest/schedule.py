"""Backtests of a run's candidates, scheduled in one place: a candidate is validated and replayed first (cheap: one
a replay gate fails gets no short run), then the shared control arms and the candidates' short runs are trained
side by side, `BacktestConfig.parallel` training children at a time (one core each).

`backtest` judges one candidate (`evotrainer backtest`, `evotrainer propose`); `backtest_all` a generation's
candidates (the loop's backtest node). Results are written to `reports/backtest-<branch>.json` and `.md` only
when every part succeeded, and a report already written for the same commit is reused.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from evotrainer.base.config import BacktestConfig
from evotrainer.base.errors import UserError
from evotrainer.base.files import atomic_write_text
from evotrainer.trainer.backtest.arms import Arms, Bench, Harness, short_run
from evotrainer.trainer.backtest.replay import ReplayResult, replay_source, run_replay
from evotrainer.trainer.backtest.results import Arm, BacktestResult
from evotrainer.trainer.evidence import branch_dir


def report_path(bench: Bench, branch: str) -> Path:
    return bench.path / "reports" / f"backtest-{branch_dir(branch)}.json"


def write_report(bench: Bench, result: BacktestResult) -> None:
    path = report_path(bench, result.branch)
    atomic_write_text(path.with_suffix(".md"), result.markdown())
    atomic_write_text(path, result.model_dump_json(indent=2))  # last: its presence means done


def train_controls(bench: Bench, cfg: BacktestConfig, seeds: list[int], on_progress=None) -> list[Arm]:
    """The control arms of a generation's short runs (the champion harness from the champion policy), trained
    ahead: candidates backtested in parallel threads then find them done, or wait for them (one lock per arm)."""
    arms = Arms(bench, bench.starting_policy(), cfg, on_progress)
    c = bench.champion
    return [arms.run("control", "control", c.commit, Path(c.dir), s)[0] for s in seeds]


def backtest(bench: Bench, cand: Harness, *, replay_only: bool = False, cfg: BacktestConfig | None = None,
             generation: int | None = None, on_progress=None, write: bool = True, screen: bool = True,
             validated: bool = False, replay: ReplayResult | None = None) -> BacktestResult:
    """Replay and (unless `replay_only`) short-run backtest of one candidate. With `screen`, the replay runs first
    where the champion line has stored rollouts, and a candidate it gates gets no short run. `validated`: the
    candidate's commit was validated already (the loop's implement node commits nothing else); `replay`: its
    screening replay, already computed (`backtest_all`). `generation` replays the champion line's rollouts of
    that generation instead of the latest ones.

    Any failure (no evidence, an invalid or crashing candidate) raises one UserError and writes nothing.
    """
    from evotrainer.trainer import jobs
    from evotrainer.trainer.harness import load_spec

    started = time.time()
    cfg = cfg or BacktestConfig()  # RunWorkspace.backtest passes the run's own
    branch, cand_dir, champ_dir = cand.branch, Path(cand.dir), Path(bench.champion.dir)
    champ_spec = load_spec(champ_dir)
    thresholds = champ_spec.analyzers  # the champion's gates judge every candidate
    scale = champ_spec.trainer.get("scale_rewards", "group")
    if not validated:
        problems = jobs.validate_harness(cand_dir, bench.path, label=f"candidate {branch}")
        if problems:
            raise UserError(f"candidate {branch} is invalid: {problems[0]}")
    gen = bench.generation
    source = (generation, ["main"]) if generation is not None else replay_source(bench.evidence, gen)
    if replay_only and source is None and replay is None:
        raise UserError(f"run {bench.run} has no stored rollouts of the champion line to replay on: train it first, "
                        "or drop --replay-only so the short run's control provides them")
    label = f"replay of {branch}"
    # the replay first where there are stored rollouts to replay: a candidate it gates costs no short run
    if replay is None and source is not None:
        replay = run_replay(cand_dir, bench.evidence, source[0], source[1], thresholds, bench.path, label, scale)
    short, start = None, bench.start
    if not replay_only and not (screen and replay and replay.failed_gates):
        start = bench.starting_policy(on_progress("warm-up (SFT, cached)") if on_progress else None)
        short = short_run(bench, cand, start, cfg, thresholds, on_progress)
    if replay is None:  # the control arms are the champion harness's rollouts from the champion policy
        replay = run_replay(cand_dir, bench.evidence, gen, ["control"], thresholds, bench.path, label, scale)
    gates = sorted(set(replay.failed_gates) | set(short.failed_gates if short else []))
    result = BacktestResult(run=bench.run, branch=branch, commit=cand.commit, champion_commit=bench.champion.commit,
                            generation=gen, start_checkpoint=str(start) if start else None, replay=replay,
                            short_run=short, failed_gates=gates, seconds=round(time.time() - started, 1))
    if write:
        write_report(bench, result)
    return result


def backtest_all(bench: Bench, cands: list[Harness], cfg: BacktestConfig, *, short_runs: bool = True,
                 validated: bool = False, on_progress: Callable[[str], Callable[[dict], None]] | None = None,
                 status: Callable[[str], None] | None = None) -> dict[str, BacktestResult | UserError]:
    """Every candidate of a generation, by branch: its backtest, or the UserError that stopped it.

    A report already written for the same commit is reused. Each other candidate is validated and replayed
    once; one a replay gate fails (or every one, under the replay-only ablation `short_runs=False`) is reported
    on its replay alone. The rest get short runs: the shared control arms are submitted first, so that no
    candidate waits for them idle, then the candidates, `cfg.parallel` training children at a time.
    """
    feed = on_progress or (lambda label: None)
    status = status or (lambda text: None)
    out: dict[str, BacktestResult | UserError] = {}
    todo: list[tuple[Harness, BacktestResult]] = []
    for cand in cands:
        path = report_path(bench, cand.branch)
        if path.is_file():
            done = BacktestResult.model_validate_json(path.read_text())
            if done.commit == cand.commit:
                out[cand.branch] = done
                continue
        try:
            screened = backtest(bench, cand, replay_only=True, write=False, validated=validated)
        except UserError as e:
            out[cand.branch] = e
            continue
        if screened.failed_gates or not short_runs:
            write_report(bench, screened)
            out[cand.branch] = screened
        else:
            todo.append((cand, screened))
    one = cfg.model_copy(update={"parallel": 1})  # the pool below holds the cores

    def short(cand: Harness, screened: BacktestResult) -> BacktestResult:
        status(f"generation {bench.generation}: backtest {cand.branch}")
        return backtest(bench, cand, cfg=one, validated=True, replay=screened.replay,
                        on_progress=lambda label: feed(f"{cand.branch} {label}"))

    with ThreadPoolExecutor(max_workers=cfg.parallel) as pool:
        if todo:
            for s in range(cfg.seeds):
                pool.submit(train_controls, bench, one, [s], feed)
        futures = {cand.branch: pool.submit(short, cand, screened) for cand, screened in todo}
        for branch, fut in futures.items():
            try:
                out[branch] = fut.result()
            except UserError as e:
                out[branch] = e
    return out
