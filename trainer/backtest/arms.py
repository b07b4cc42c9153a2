"""Short runs (DESIGN §7): candidate and control trained side by side from the champion's policy, same seeds,
judged on sealed dev with the paired bootstrap, extended seed by seed while undecided.

Nothing here knows a run workspace: a `Bench` carries what a backtest needs of a run as paths and commits
(`RunWorkspace.bench` resolves it). Arms are cached under `backtests/g<N>/<branch>/<commit>-s<seed>-k<steps>/`
and read back by that exact evidence tag, so the control arms are shared by a generation's candidates and an
interrupted backtest resumes.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import BaseModel, Field

from evotrainer.base.config import BacktestConfig
from evotrainer.base.errors import UserError
from evotrainer.trainer.backtest.replay import defects, gate_keys, score_in_child
from evotrainer.trainer.backtest.results import Arm, ShortRunResult
from evotrainer.trainer.backtest.statistics import Z_POWER, backtest_interval, decide, paired_bootstrap
from evotrainer.trainer.diagnostics import Finding
from evotrainer.trainer.evidence import read_rollouts
from evotrainer.trainer.reward_gates import CrossScore, cross_score, divergence_gate


class Harness(BaseModel):
    """One harness of a run at one commit, as a snapshot directory nobody edits."""

    branch: str
    commit: str
    dir: str


class Bench(BaseModel):
    """What a backtest needs of a run, as paths and commits (`RunWorkspace.bench` resolves it from the run)."""

    run: str = Field(description="the run directory: evidence/, backtests/, reports/, specs/ and logs/ are under it")
    domain: str
    seed: int
    fingerprint: str = Field(description="the sealed scorer's fingerprint the run was created with")
    generation: int = Field(description="the generation whose candidates are backtested")
    horizon: int = Field(description="the main line's horizon: arms continue the champion's training line")
    champion: Harness
    start: str | None = Field(None, description="the policy short runs start from: the champion's (None: the "
                                                "domain's cached warm policy, built on a miss)")

    @property
    def path(self) -> Path:
        return Path(self.run)

    @property
    def evidence(self) -> Path:
        return Path(self.run) / "evidence"

    def starting_policy(self, on_progress=None) -> Path:
        from evotrainer.trainer import jobs

        return Path(self.start) if self.start else jobs.warm_policy(self.domain, self.seed, self.path,
                                                                    on_progress=on_progress)


def arm_tag(commit: str, seed: int, steps: int) -> str:
    """The evidence writer tag of one short-run arm."""
    return f"{commit[:8]}-s{seed}-k{steps}"


def both_harnesses(run: Path, generation: int, branch: str, cand_dir: Path, champ_dir: Path, cand_tags: list[str],
                   ctrl_tags: list[str]) -> tuple[CrossScore, pd.DataFrame]:
    """Both arms' training rollouts under both harnesses' rewards: each harness's code re-scores the other arm's
    rollouts in an isolated child, so that every comparison of reward is made under one reward."""
    from evotrainer.trainer.harness import load_spec

    ev = run / "evidence"
    cand = read_rollouts(ev, generation, branch, cand_tags).to_pandas()
    ctrl = read_rollouts(ev, generation, "control", ctrl_tags).to_pandas()
    _, on_ctrl = score_in_child(cand_dir, ev, generation, ["control"], run, f"{branch}'s rewards on the control arms",
                                tags=ctrl_tags, rewards_only=True)
    _, on_cand = score_in_child(champ_dir, ev, generation, [branch], run, f"the champion's rewards on {branch}'s arms",
                                tags=cand_tags, rewards_only=True)
    if on_ctrl.rollout_ids != ctrl["rollout_id"].tolist() or on_cand.rollout_ids != cand["rollout_id"].tolist():
        raise UserError("a scoring child scored other rollouts than the short run's: its result is refused")
    weights = {h: {f"reward_{r.name}": r.weight for r in load_spec(d).rewards} for h, d in (("cand", cand_dir),
                                                                                          ("champ", champ_dir))}
    return cross_score(cand, ctrl, on_ctrl.rewards, on_cand.rewards, weights["cand"], weights["champ"]), cand


_ARM_LOCKS: dict[str, threading.Lock] = {}
_ARM_LOCKS_GUARD = threading.Lock()


def _arm_lock(path: Path) -> threading.Lock:
    """One lock per arm directory: backtests of several candidates in threads share the control arms, and the
    second one to need an arm waits for the first to finish it instead of training it again."""
    with _ARM_LOCKS_GUARD:
        return _ARM_LOCKS.setdefault(str(path), threading.Lock())


class Arms:
    """Trains and evaluates arms, each once: a finished arm (its checkpoint has meta.json) is reused, so the
    control is shared by every candidate of a generation and an interrupted backtest resumes."""

    def __init__(self, bench: Bench, start: Path, cfg: BacktestConfig, on_progress):
        self.bench, self.domain, self.generation = bench, bench.domain, bench.generation
        self.start, self.cfg = start, cfg
        self.fingerprint, self.on_progress = bench.fingerprint, on_progress

    def run(self, role: str, branch: str, commit: str, harness_dir: Path, seed: int):
        from evotrainer.trainer import executor
        from evotrainer.trainer.evidence import branch_dir

        tag = arm_tag(commit, seed, self.cfg.steps)
        out = self.bench.path / "backtests" / f"g{self.generation}" / branch_dir(branch) / tag
        ex = executor.current()
        # a local job reports its steps to the live display; a Ray task has no way back to it
        progress = self.on_progress(f"{role} s{seed}") if self.on_progress and ex.name == "local" else None
        with _arm_lock(out):
            return ex.call("short_run_arm", train_arm, self.bench, self.start, self.cfg, role, branch, commit,
                           harness_dir, seed, out, progress)


def train_arm(bench: Bench, start: Path, cfg: BacktestConfig, role: str, branch: str, commit: str, harness_dir: Path,
              seed: int, out: Path, on_progress=None) -> tuple[Arm, np.ndarray]:
    """One arm, trained once (a finished one, its checkpoint's meta.json written, is only scored) and scored on
    sealed dev: the job an executor runs (`trainer/executor.py`), here or in a Ray worker."""
    from evotrainer.trainer import jobs
    from evotrainer.trainer.evidence import read_rollouts
    from evotrainer.trainer.grpo import TrainSpec, state_step

    started = time.time()
    tag = arm_tag(commit, seed, cfg.steps)
    ckpt = out / "checkpoints" / "policy"
    if not (ckpt / "meta.json").is_file():
        # the arm continues the champion's line (its optimizer, schedule and data order); seed 0 samples as the
        # line would, so the control's seed-0 arm is the main line's next segment, and a candidate's paired arm
        # differs from it by the harness alone; seed s > 0 is a replicate that samples anew
        cont = jobs.continuation(start, harness_dir)
        at = state_step(cont["resume_state"]) if cont["resume_state"] else 0
        # a backtest longer than the run's short runs (`evotrainer backtest --steps`) runs past the line's horizon
        spec = TrainSpec(domain=bench.domain, checkpoint=str(start), harness_dir=str(harness_dir),
                         steps=cfg.steps, seed=bench.seed,
                         horizon=max(bench.horizon, at + cfg.steps), reseed=seed or None,
                         keep_state=True, **cont,
                         out_dir=str(out), checkpoint_id="policy",
                         checkpoints_dir=str(out / "checkpoints"), evidence_dir=str(bench.evidence),
                         run=bench.path.name, generation=bench.generation, branch=branch, harness_commit=commit,
                         evidence_tag=tag, result_path=str(out / "specs" / "train.result.json"))
        jobs.train(spec, out, on_progress=on_progress)
    ev = jobs.evaluate(ckpt, bench.domain, "dev", out, k=0, limit=cfg.dev_items, seed=seed,
                       expected_fingerprint=bench.fingerprint)
    rows = read_rollouts(bench.evidence, bench.generation, branch, [tag]).to_pandas()
    spread = rows.groupby("group_id", sort=False)["reward"].agg(lambda x: float(x.max() - x.min()))
    arm = Arm(role=role, seed=seed, commit=commit, checkpoint=str(ckpt), dev_accuracy=ev.accuracy,
              train_reward=float(rows["reward"].mean()), train_correct=float(rows["correct"].mean()),
              seconds=round(time.time() - started, 1), live_groups=float((spread > 1e-9).mean()))
    return arm, np.array(ev.greedy_correct, dtype=float)


def evidence_shapers(cand_dir: Path, champ_dir: Path) -> list[str]:
    """The parts of the harness the candidate changed, of those that decide what the analyzers read besides the
    policy's own behaviour: `rewards` (the terms and rewards.py: every reward-reading analyzer scores rollouts
    under the candidate's reward, and a tie-break term makes every group look alive), `filters` (which training
    prompts the evidence holds: dropping the long ones shortens it without a longer limit) and `diagnostics` (the
    harness's own analyzers, which run from the candidate's copy). A group filter is none of them: the rollouts it
    drops stay in the evidence, marked."""
    from evotrainer.trainer.harness import load_spec

    cand, champ = load_spec(cand_dir), load_spec(champ_dir)

    def files(root: Path, rel: str) -> dict[str, bytes]:
        path = root / rel
        found = sorted(path.rglob("*.py")) if path.is_dir() else [path] if path.is_file() else []
        return {str(f.relative_to(root)): f.read_bytes() for f in found if "__pycache__" not in f.parts}

    parts = {"rewards": (lambda h, d: (h.rewards, files(d, "rewards.py"))),
             "filters": (lambda h, d: (h.filters, files(d, "filters.py"))),
             "diagnostics": (lambda h, d: files(d, "diagnostics"))}
    return [name for name, of in parts.items() if of(cand, cand_dir) != of(champ, champ_dir)]


def short_run(bench: Bench, cand: Harness, start: Path, cfg: BacktestConfig, thresholds: dict, on_progress=None
              ) -> ShortRunResult:
    """Candidate vs control from the champion checkpoint, same seeds; sequential over seeds (DESIGN §7)."""
    from concurrent.futures import ThreadPoolExecutor

    from evotrainer.trainer.diagnostics.report import health_report

    started = time.time()
    arms = Arms(bench, start, cfg, on_progress)
    branch, commit, cand_dir = cand.branch, cand.commit, Path(cand.dir)
    champ_commit, champ_dir, generation = bench.champion.commit, Path(bench.champion.dir), bench.generation
    results: dict[tuple[str, int], tuple[Arm, np.ndarray]] = {}
    trace: list[str] = []
    n, seeds = cfg.seeds, []
    findings: list[Finding] = []
    while True:
        new = [s for s in range(n) if s not in seeds]
        controls = [("control", "control", champ_commit, champ_dir, s) for s in new]
        mine = [("candidate", branch, commit, cand_dir, s) for s in new]
        # one at a time: the candidate's own arms first, while another thread may still be training a shared control
        jobs_ = controls + mine if cfg.parallel > 1 else mine + controls
        with ThreadPoolExecutor(max_workers=cfg.parallel) as pool:
            futures = {(role, s): pool.submit(arms.run, role, br, c, d, s) for role, br, c, d, s in jobs_}
            for key, fut in futures.items():
                results[key] = fut.result()  # the first failure propagates: no partial result is reported
        seeds += new
        diffs = np.stack([results[("candidate", s)][1] - results[("control", s)][1] for s in seeds])
        delta, lo, hi, se, estimable = backtest_interval(diffs, cfg.bootstrap, cfg.seed_sd)
        cand_tags = [arm_tag(commit, s, cfg.steps) for s in seeds]  # exact: never a longer run's arms of the commit
        rep = health_report(bench.evidence, generation, branch, cand_dir, bench.path, tag=cand_tags,
                            thresholds=thresholds)
        cross, cand_rows = both_harnesses(bench.path, generation, branch, cand_dir, champ_dir, cand_tags,
                                          [arm_tag(champ_commit, s, cfg.steps) for s in seeds])
        findings = rep.findings + divergence_gate(cross, cand_rows, lo, thresholds)
        note = (f"{len(seeds)} seeds x {cfg.steps} steps: {delta:+.3f} "
                + (f"[{lo:+.3f}, {hi:+.3f}], MDE {Z_POWER * se:.3f}" if estimable else
                   "(interval not estimable: one seed and no training-seed spread configured)")
                + (f" (one seed: a training-seed spread of {cfg.seed_sd:g} included)"
                   if len(seeds) == 1 and cfg.seed_sd else ""))
        stopped = decide(delta, lo, hi, len(seeds), cfg.max_seeds, sorted({f.analyzer for f in findings if f.gate}))
        trace.append(f"{note} -> {stopped or 'extend by one seed'}")
        if stopped:
            break
        n += 1
    # the champion is judged by the same gates: a gate its own arms fail is one a candidate may repair
    ctrl_rep = health_report(bench.evidence, generation, "control", champ_dir, bench.path,
                             tag=[arm_tag(champ_commit, s, cfg.steps) for s in seeds], thresholds=thresholds)
    vs_start: dict = {}
    if ctrl_rep.failed_gates:  # the champion's score is not one to beat: is the candidate at least where it started?
        from evotrainer.trainer import jobs

        ev = jobs.evaluate(start, bench.domain, "dev", bench.path / "backtests" / f"g{generation}", k=0,
                           limit=cfg.dev_items, seed=bench.seed,  # the train node's key: its cached score
                           expected_fingerprint=bench.fingerprint)
        base = np.array(ev.greedy_correct, dtype=float)
        d0, lo0, hi0, _ = paired_bootstrap(np.stack([results[("candidate", s)][1] - base for s in seeds]),
                                           cfg.bootstrap)
        vs_start = dict(start_dev=ev.accuracy, start_delta=d0, start_ci_low=lo0, start_ci_high=hi0)
    cand = [results[("candidate", s)][0] for s in seeds]
    ctrl = [results[("control", s)][0] for s in seeds]
    all_arms = ctrl + cand
    return ShortRunResult(
        steps=cfg.steps, seeds=seeds, dev_items=int(diffs.shape[1]), arms=all_arms,
        per_seed_delta=[float(d.mean()) for d in diffs], delta=delta, ci_low=lo, ci_high=hi, se=se,
        mde=min(Z_POWER * se, 1.0) if estimable else 1.0, estimable=estimable,
        train_reward_delta=float(np.mean([a.train_reward for a in cand]) - np.mean([a.train_reward for a in ctrl])),
        train_correct_delta=float(np.mean([a.train_correct for a in cand]) - np.mean([a.train_correct for a in ctrl])),
        findings=findings, failed_gates=sorted({f.analyzer for f in findings if f.gate}),
        control_gates=sorted(set(ctrl_rep.failed_gates)), control_gate_keys=sorted(gate_keys(ctrl_rep.findings)),
        control_defects=defects(ctrl_rep.findings), shapers=evidence_shapers(cand_dir, champ_dir),
        cross=cross, **vs_start, stopped=stopped, trace=trace,
        seconds=round(time.time() - started, 1),
        seconds_per_arm=round(float(np.mean([a.seconds for a in all_arms])), 1),
    )
