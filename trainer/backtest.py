"""Backtests (DESIGN §7): evidence that a candidate harness deserves promotion, before it is promoted.

Replay: the candidate's reward functions, group filters and analyzers applied to stored rollouts, in an
isolated child whose working directory is the candidate's harness
(`python -m evotrainer.trainer.backtest SPEC.json`, `replay_scores`): the child returns only what the
harness computes (rewards per rollout, the groups its filters keep, its own analyzers' findings); every
statistic and gate is computed from them here, in the parent (`replay`), against the stored sealed grades
the child cannot change. It reports the counterfactual reward distribution
per component, zero-variance groups before and after (rescued by the new reward, dropped by the
filters), the new reward's agreement with the sealed `correct` (correlation, AUC), the fraction of
rollouts whose reward changed, and gate hits.

The replay's own gates: `replay_agreement` fires when the candidate's reward pays incorrect answers as
if they were right (see `Agreement`) more often than the champion's reward did (a drop of its correlation
with `correct` is a warning: a format weight lowers it too): the reward bug an agent's edit introduces (an
unparsable answer scored as correct) shows up here before a single training step. `unsealed_preference`
(`reward_gates.py`) fires when a new or changed term pays for what the sealed grade does not see.

Gate thresholds are always the champion's: a candidate cannot loosen the gates that judge it.
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from evotrainer.base.errors import UserError
from evotrainer.trainer.diagnostics import Finding
from evotrainer.trainer.evidence import read_rollouts, read_steps
from evotrainer.trainer.reward_gates import (
    CrossScore,
    UnsealedShare,
    cross_score,
    divergence_gate,
    unsealed_gate,
    unsealed_share,
)

REPLAY_GATE = {"rewarded_incorrect": 0.02, "corr_drop": 0.10}


class Distribution(BaseModel):
    mean: float
    std: float
    min: float
    p10: float
    p50: float
    p90: float
    max: float

    @classmethod
    def of(cls, x: pd.Series | np.ndarray) -> Distribution:
        x = np.asarray(x, dtype=float)
        q = np.quantile(x, [0.0, 0.1, 0.5, 0.9, 1.0]) if len(x) else [math.nan] * 5
        return cls(mean=float(x.mean()) if len(x) else math.nan, std=float(x.std()) if len(x) else math.nan,
                   min=q[0], p10=q[1], p50=q[2], p90=q[3], max=q[4])


class Agreement(BaseModel):
    """How well a reward tracks the sealed grade: Pearson correlation, ROC AUC of reward for `correct`, and the
    fraction of incorrect rollouts paid more like a right answer than like the worst one (above half-way from
    the lowest reward to the median reward of correct rollouts). AUC alone misses the typical bug: a wrong
    answer paid 1.0 still ranks below a right one paid 1.1."""

    corr: float | None
    auc: float | None
    rewarded_incorrect: float | None


class ReplaySpec(BaseModel):
    harness_dir: str  # the candidate (its rewards, group filters, own analyzers)
    evidence_root: str
    generation: int | None = None
    branches: list[str] = Field(default_factory=lambda: ["main"])
    tags: list[str] | None = None  # exact writer tags (a short run's arms); None: every chunk of the branches
    rewards_only: bool = False  # score the rewards alone: no group filters, no analyzers (both-arm scoring)
    baseline_scale: str = "group"  # the champion's scale_rewards (the stored rewards' advantage normalisation)
    thresholds: dict[str, dict[str, float]] = Field(default_factory=dict)  # the champion's
    sealed_columns: list[str] = Field(default_factory=list)  # the domain's own sealed evidence columns
    result_path: str


class ReplayScores(BaseModel):
    """What the replay child computed with the candidate's code: nothing else of a replay comes from it."""

    model_config = ConfigDict(ser_json_inf_nan="constants")  # NaN (a None reward) and inf survive the file

    rollout_ids: list[str]
    rewards: dict[str, list[float]]  # reward_<name> -> one value per rollout (NaN: the function returned None)
    kept_groups: dict[str, bool] | None  # group id -> kept by the group filters (None: no group filters)
    findings: list[Finding]  # the harness's own analyzers over the re-scored rollouts
    findings_before: list[Finding] = []  # ... and over the rollouts as stored (what the champion's rewards paid)


class ReplayResult(BaseModel):
    harness: str
    n_rollouts: int
    n_groups: int
    generations: list[int]
    branches: list[str]
    reward_before: Distribution
    reward_after: Distribution
    components_before: dict[str, Distribution]
    components_after: dict[str, Distribution]
    changed_fraction: float  # rollouts whose total reward changed by more than 1e-6
    agreement_before: Agreement
    agreement_after: Agreement
    dead_groups_before: int
    dead_groups_after: int  # under the new reward, before the group filters
    groups_rescued: int  # dead before, with reward variance under the new reward
    groups_deadened: int  # alive before, dead under the new reward
    groups_dropped: int  # taken out of the loss by the candidate's group filters
    dead_groups_dropped: int
    dead_ratio_before: float
    dead_ratio_after: float  # among the groups that stay in the loss
    unsealed: UnsealedShare | None = None  # preferences within one sealed grade, champion's reward vs candidate's
    findings: list[Finding]
    failed_gates: list[str]
    inherited_gates: list[str] = []  # gates whose every failing metric the stored rollouts fail under the champion too
    seconds: float


def _key(f: Finding) -> str:
    return f"{f.analyzer}/{f.metric}"


def gate_keys(findings: list[Finding]) -> set[str]:
    """Failed gates per metric (`analyzer/metric`): inheritance from the champion is decided metric by metric."""
    return {_key(f) for f in findings if f.gate}


def agreement(reward: np.ndarray, correct: np.ndarray) -> Agreement:
    reward, correct = np.asarray(reward, dtype=float), np.asarray(correct, dtype=bool)
    n_pos, n_neg = int(correct.sum()), int((~correct).sum())
    if n_pos == 0 or n_neg == 0:
        return Agreement(corr=None, auc=None, rewarded_incorrect=None)
    corr = float(np.corrcoef(reward, correct)[0, 1]) if reward.std() > 0 else 0.0
    ranks = pd.Series(reward).rank(method="average").to_numpy()
    auc = float((ranks[correct].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
    paid = float((reward[~correct] >= _paid_bar(reward, correct)).mean())
    return Agreement(corr=corr, auc=auc, rewarded_incorrect=paid)


def _paid_bar(reward: np.ndarray, correct: np.ndarray) -> float:
    """Half-way from the lowest reward to the median reward of a correct rollout: above it, a rollout is paid
    more like a right answer than like the worst one."""
    floor, right = float(reward.min()), float(np.median(reward[correct]))
    return floor + 0.5 * (right - floor) if right > floor else right


def _dead(df: pd.DataFrame, column: str) -> pd.Series:
    """Per group: True when every rollout of the group got the same value of `column`."""
    g = df.groupby("group_id", sort=False)[column]
    return (g.max() - g.min()) < 1e-6


def _batches(df: pd.DataFrame) -> pd.Series:
    """Batch number of each row: consecutive rows of one (generation, branch, seed tag, step) were one TRL call."""
    key = df["rollout_id"].str.rsplit(":", n=2).str[0] + "|" + df["generation"].astype(str)
    return (key != key.shift()).cumsum()


def _call_reward(fn, batch: pd.DataFrame, tasks: list[dict]) -> list[float]:
    """The call TRL makes: prompts and completions by name, every dataset column as a keyword."""
    columns: dict[str, list] = {}
    for t in tasks:
        for k in t:
            columns.setdefault(k, [])
    for k in columns:
        columns[k] = [t.get(k) for t in tasks]
    n = len(batch)
    out = fn(prompts=batch["prompt"].tolist(), completions=batch["completion"].tolist(),
             completion_ids=[list(x) if x is not None else [] for x in batch["completion_ids"]],
             prompt_ids=batch["prompt_id"].tolist(), trainer_state=None, log_extra=lambda *a, **k: None,
             log_metric=lambda *a, **k: None, **columns)
    if not isinstance(out, list | tuple) or len(out) != n:
        got = len(out) if isinstance(out, list | tuple) else type(out).__name__
        raise UserError(f"reward {fn.__name__!r} returned {got} values for {n} completions during replay")
    return [math.nan if v is None else float(v) for v in out]


def _read_source(spec: ReplaySpec) -> pd.DataFrame:
    frames = [read_rollouts(spec.evidence_root, spec.generation, b, spec.tags).to_pandas() for b in spec.branches]
    df = pd.concat([f for f in frames if not f.empty] or [frames[0]], ignore_index=True)
    if df.empty:
        raise UserError(f"no stored rollouts of generation {spec.generation} on {', '.join(spec.branches)} under "
                        f"{spec.evidence_root} to replay: train the champion first")
    if "task" not in df or df["task"].isna().any():
        raise UserError(f"rollouts under {spec.evidence_root} carry no task columns (written by an older "
                        "EvoTrainer): replay needs evidence from this version")
    return df


def _read_steps(spec: ReplaySpec) -> pd.DataFrame:
    return pd.concat([read_steps(spec.evidence_root, spec.generation, b, spec.tags).to_pandas() for b in spec.branches],
                     ignore_index=True)


def replay_scores(spec: ReplaySpec) -> ReplayScores:
    """The candidate's rewards, group-filter decisions and own analyzers on stored rollouts. Imports harness
    code: isolated child only."""
    from evotrainer.trainer.diagnostics import load_harness_analyzers, run_all
    from evotrainer.trainer.harness import keep_groups, load_group_filters, load_reward_functions, load_spec

    df = _read_source(spec)
    hspec = load_spec(spec.harness_dir)
    funcs = load_reward_functions(spec.harness_dir, hspec)
    group_filters = [] if spec.rewards_only else load_group_filters(spec.harness_dir, hspec)
    own = [] if spec.rewards_only else load_harness_analyzers(spec.harness_dir)

    tasks = [json.loads(t) for t in df["task"]]
    names = [f"reward_{r.name}" for r in hspec.rewards]
    new = np.full((len(df), len(funcs)), np.nan)
    batch_ids = _batches(df).to_numpy()
    bounds = np.flatnonzero(np.diff(batch_ids)) + 1
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(df)]):
        batch = df.iloc[lo:hi]
        for j, fn in enumerate(funcs):
            new[lo:hi, j] = _call_reward(fn, batch, tasks[lo:hi])
    after = _rescored(df, new, names, [r.weight for r in hspec.rewards])
    kept = None
    if group_filters:
        view = after.drop(columns=[c for c in ("correct", "formatted", *spec.sealed_columns) if c in after])
        view["task_columns"] = tasks
        records = [{**{k: v for k, v in r.items() if k != "task_columns"}, **r["task_columns"]}
                   for r in view.to_dict("records")]
        groups: dict[str, list[dict]] = {}
        for gid, rec in zip(after["group_id"].tolist(), records):
            groups.setdefault(gid, []).append(rec)
        kept = dict(zip(groups, keep_groups(group_filters, list(groups.values()))))
    steps = _read_steps(spec) if own else None
    findings = run_all(after, steps, spec.thresholds, only=own) if own else []
    findings_before = run_all(df, steps, spec.thresholds, only=own) if own else []
    return ReplayScores(rollout_ids=df["rollout_id"].tolist(), rewards={n: new[:, j].tolist()
                                                                         for j, n in enumerate(names)},
                        kept_groups=kept, findings=findings, findings_before=findings_before)


def _rescored(df: pd.DataFrame, new: np.ndarray, names: list[str], weights: list[float]) -> pd.DataFrame:
    """The stored rollouts with the candidate's reward components and TRL's weighted total."""
    after = df.drop(columns=[c for c in df.columns if c.startswith("reward_")]).copy()
    after["reward"] = np.nansum(new * np.array(weights), axis=1)  # TRL's aggregation: None counts as absent
    for j, name in enumerate(names):
        after[name] = new[:, j]
    return after


def replay(spec: ReplaySpec, scores: ReplayScores, seconds: float = 0.0) -> ReplayResult:
    """Every statistic and gate of a replay, computed here from the stored (sealed-graded) rollouts and the child's
    scores; the built-in analyzers run here too, so harness code cannot hide a gate."""
    from evotrainer.trainer.diagnostics import run_all
    from evotrainer.trainer.harness import load_spec

    df = _read_source(spec)
    if scores.rollout_ids != df["rollout_id"].tolist():
        raise UserError("the replay child scored other rollouts than the stored ones: its result is refused")
    hspec = load_spec(spec.harness_dir)  # YAML only: the weights and names of the candidate's rewards
    names = [f"reward_{r.name}" for r in hspec.rewards]
    if sorted(scores.rewards) != sorted(names) or any(len(v) != len(df) for v in scores.rewards.values()):
        raise UserError("the replay child returned rewards that do not match the candidate's harness.yaml")
    new = np.column_stack([np.asarray(scores.rewards[n], dtype=float) for n in names])
    if not np.isfinite(np.nan_to_num(new, nan=0.0)).all():
        raise UserError("a candidate reward returned an infinite value during replay")
    before = df.copy()
    after = _rescored(df, new, names, [r.weight for r in hspec.rewards])
    total = after["reward"].to_numpy()

    dead_before, dead_after = _dead(before, "reward"), _dead(after, "reward")
    kept = pd.Series(True, index=dead_after.index)
    if scores.kept_groups is not None:
        kept = pd.Series(scores.kept_groups).reindex(dead_after.index).fillna(False).astype(bool)
        after.loc[~after["group_id"].map(kept).astype(bool), "loss_masked"] = True

    steps = _read_steps(spec)
    findings = run_all(after, steps, spec.thresholds) + list(scores.findings)
    # the stored rollouts are the champion's episodes: a gate they already fail under the champion's own rewards
    # (a behaviour the candidate's change has not had the chance to alter, like a leak an env.py edit closes) says
    # nothing about the candidate; the short run judges its own rollouts. Per metric: the champion's format reward
    # rising must not hide a rise of the candidate's new term.
    inherited = gate_keys(run_all(before, steps, spec.thresholds) + list(scores.findings_before))
    agree_before = agreement(before["reward"].to_numpy(), before["correct"].to_numpy())
    agree_after = agreement(total, after["correct"].to_numpy())
    findings += _agreement_gate(agree_before, agree_after, after, spec.thresholds.get("replay_agreement", {}))
    unsealed = unsealed_share(before, after, {n: r.weight for n, r in zip(names, hspec.rewards)},
                              spec.baseline_scale, hspec.trainer.get("scale_rewards", "group"))
    findings += unsealed_gate(unsealed, after, spec.thresholds)

    components_before = {c: Distribution.of(before[c]) for c in before.columns if c.startswith("reward_")}
    return ReplayResult(
        harness=spec.harness_dir, n_rollouts=len(df), n_groups=int(len(dead_before)),
        generations=sorted(int(g) for g in df["generation"].unique()), branches=sorted(df["branch"].unique()),
        reward_before=Distribution.of(before["reward"]), reward_after=Distribution.of(total),
        components_before=components_before, components_after={c: Distribution.of(after[c]) for c in names},
        changed_fraction=float((np.abs(total - before["reward"].to_numpy()) > 1e-6).mean()),
        agreement_before=agree_before, agreement_after=agree_after,
        dead_groups_before=int(dead_before.sum()), dead_groups_after=int(dead_after.sum()),
        groups_rescued=int((dead_before & ~dead_after).sum()), groups_deadened=int((~dead_before & dead_after).sum()),
        groups_dropped=int((~kept).sum()), dead_groups_dropped=int((~kept & dead_after).sum()),
        dead_ratio_before=float(dead_before.mean()),
        dead_ratio_after=float(dead_after[kept].mean()) if kept.any() else 0.0,
        unsealed=unsealed, findings=findings,
        failed_gates=sorted({f.analyzer for f in findings if f.gate and _key(f) not in inherited}),
        inherited_gates=sorted({f.analyzer for f in findings if f.gate and _key(f) in inherited}),
        seconds=round(seconds, 3),
    )


def _agreement_gate(before: Agreement, after: Agreement, rows: pd.DataFrame, t: dict) -> list[Finding]:
    t = {**REPLAY_GATE, **t}
    if after.rewarded_incorrect is None or before.rewarded_incorrect is None:
        return []
    out = []
    rise = after.rewarded_incorrect - before.rewarded_incorrect
    if rise > t["rewarded_incorrect"]:
        bar = _paid_bar(rows["reward"].to_numpy(dtype=float), rows["correct"].to_numpy(dtype=bool))
        paid = rows[(~rows["correct"].astype(bool)) & (rows["reward"] >= bar)]
        out.append(Finding(analyzer="replay_agreement", metric="rewarded_incorrect_rise", value=rise,
                           threshold=t["rewarded_incorrect"], severity="critical", gate=True,
                           message=f"the candidate's reward pays {after.rewarded_incorrect:.1%} of incorrect rollouts "
                                   f"as if they were right (champion: {before.rewarded_incorrect:.1%})",
                           evidence=paid["rollout_id"].head(20).tolist()))
    if before.corr is not None and after.corr is not None and before.corr - after.corr > t["corr_drop"]:
        # a warning, not a gate: a format weight that follows the sealed parser lowers the correlation with `correct`
        # as much as a bug does; what a bug pays is gated above (wrong answers paid as right) and by
        # unsealed_preference (preferences the sealed grade does not have)
        out.append(Finding(analyzer="replay_agreement", metric="correct_corr_drop", value=before.corr - after.corr,
                           threshold=t["corr_drop"], severity="warning",
                           message=f"the reward's correlation with the sealed grade fell from {before.corr:.2f} to "
                                   f"{after.corr:.2f}"))
    return out


# ---------------------------------------------------------------------------------------------------
# The parent side: replay in a child, short runs as training children, the paired statistics.
# ---------------------------------------------------------------------------------------------------

Z_POWER = 1.959964 + 0.841621  # two-sided 5% test, 80% power: MDE = (z_0.975 + z_0.8) x SE


class ShortRunConfig(BaseModel):
    """The budget of one candidate's short-run backtest."""

    steps: int = Field(30, ge=1, description="GRPO steps of each arm from the champion checkpoint")
    seeds: int = Field(2, ge=1, description="seeds of the first round")
    max_seeds: int = Field(4, ge=1, description="sequential extension: add seeds up to this many while the "
                                                "estimate is positive and its interval straddles zero")
    dev_items: int | None = Field(None, description="sealed dev items per evaluation (None: all)")
    bootstrap: int = Field(2000, ge=100, description="bootstrap resamples of the paired difference")
    parallel: int = Field(2, ge=1, description="training children side by side (one core each)")


class Arm(BaseModel):
    """One short training run: the control (champion harness) or the candidate, for one seed."""

    role: str
    seed: int
    commit: str
    checkpoint: str
    dev_accuracy: float
    train_reward: float  # mean total reward under the arm's own harness
    train_correct: float  # sealed correct rate of its training rollouts
    seconds: float


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


class ShortRunResult(BaseModel):
    steps: int
    seeds: list[int]
    dev_items: int
    arms: list[Arm]
    per_seed_delta: list[float]
    delta: float  # candidate minus control, sealed dev greedy accuracy, averaged over seeds
    ci_low: float
    ci_high: float
    se: float
    mde: float  # minimum detectable effect at 80% power for this budget
    train_reward_delta: float
    train_correct_delta: float
    findings: list[Finding]  # the candidate's own evidence, champion thresholds, its own analyzers included
    failed_gates: list[str]
    control_gates: list[str] = []  # gates the control (the champion harness) fails on its own short-run evidence
    control_gate_keys: list[str] = []  # ... per metric (`analyzer/metric`): inheritance is decided metric by metric
    cross: CrossScore | None = None  # both arms scored under both harnesses' rewards
    # when it fails one: candidate minus the policy both arms started from (same dev items), with its interval
    start_dev: float | None = None
    start_delta: float | None = None
    start_ci_low: float | None = None
    start_ci_high: float | None = None
    stopped: str  # significant / worse / no_gain / gate / budget
    trace: list[str]
    seconds: float
    seconds_per_arm: float


class BacktestResult(BaseModel):
    run: str
    branch: str
    commit: str
    champion_commit: str
    generation: int
    start_checkpoint: str | None
    replay: ReplayResult | None
    short_run: ShortRunResult | None
    failed_gates: list[str]
    seconds: float

    def markdown(self) -> str:
        lines = [f"# Backtest of {self.branch} ({self.commit[:8]}) against the champion {self.champion_commit[:8]}",
                 "", f"Generation {self.generation}. Failed gates: {', '.join(self.failed_gates) or 'none'}.", ""]
        if self.replay:
            r = self.replay
            lines += ["## Replay", "",
                      f"{r.n_rollouts} stored rollouts in {r.n_groups} groups (generations {r.generations}, "
                      f"branches {', '.join(r.branches)}); {r.changed_fraction:.1%} changed reward.", "",
                      "| | before | after |", "|---|---|---|",
                      f"| reward mean | {r.reward_before.mean:.3f} | {r.reward_after.mean:.3f} |",
                      f"| zero-variance groups | {r.dead_groups_before} | {r.dead_groups_after} |",
                      f"| dead ratio in the loss | {r.dead_ratio_before:.3f} | {r.dead_ratio_after:.3f} |",
                      f"| corr with correct | {_f(r.agreement_before.corr)} | {_f(r.agreement_after.corr)} |",
                      f"| AUC for correct | {_f(r.agreement_before.auc)} | {_f(r.agreement_after.auc)} |",
                      f"| incorrect paid as right | {_f(r.agreement_before.rewarded_incorrect)} | "
                      f"{_f(r.agreement_after.rewarded_incorrect)} |", "",
                      f"Groups rescued by the new reward: {r.groups_rescued}; deadened: {r.groups_deadened}; "
                      f"dropped by group filters: {r.groups_dropped} ({r.dead_groups_dropped} of them dead).", ""]
            if r.unsealed:
                u = r.unsealed
                lines += [f"Advantage that prefers rollouts the sealed grade rates equal: {u.before:.2%} (champion's "
                          f"reward) -> {u.after:.2%} (candidate's).", "",
                          "| term | status | champion's share | candidate's share | unsealed part of its change |",
                          "|---|---|---|---|---|"]
                lines += [f"| {t.term} | {t.status} | {t.before:.2%} | {t.after:.2%} | {t.unsealed_fraction:.0%} |"
                          for t in u.terms]
                lines.append("")
            if r.inherited_gates:
                lines += [f"Gates the stored rollouts already fail under the champion's harness (left to the short "
                          f"run): {', '.join(r.inherited_gates)}.", ""]
            lines += [f"- **{f.severity}**{' **GATE**' if f.gate else ''} `{f.analyzer}` {f.message}"
                      for f in r.findings]
        if self.short_run:
            s = self.short_run
            lines += ["", "## Short run", "",
                      f"Budget: {len(s.seeds)} seeds x {s.steps} steps per arm, {s.dev_items} sealed dev items; "
                      f"{s.seconds:.0f} s ({s.seconds_per_arm:.0f} s per arm).", "",
                      f"Dev accuracy, candidate minus control: **{s.delta:+.3f}** "
                      f"(95% CI [{s.ci_low:+.3f}, {s.ci_high:+.3f}], minimum detectable effect {s.mde:.3f}); "
                      f"per seed {', '.join(f'{d:+.3f}' for d in s.per_seed_delta)}.",
                      f"Train reward delta {s.train_reward_delta:+.3f}; train correct delta "
                      f"{s.train_correct_delta:+.3f}. Stopped: {s.stopped}.", ""]
            if s.cross:
                c = s.cross
                lines += [f"Both arms under one reward ({c.rollouts[0]} and {c.rollouts[1]} training rollouts): "
                          f"reward delta {c.reward_delta:+.4f} under the candidate's, {c.reward_delta_champion:+.4f} "
                          f"under the champion's; sealed correct {c.correct_delta:+.4f}.", "",
                          "| harness | term | status | weight | paid delta | among equally correct | effect (sd) | z |",
                          "|---|---|---|---|---|---|---|---|"]
                lines += [f"| {t.harness} | {t.term} | {t.status} | {t.weight:g} | {t.paid_delta:+.4f} | "
                          f"{t.within_delta:+.4f} | {t.effect:+.2f} | {t.z:+.1f} |" for t in c.terms]
                lines.append("")
            if s.control_gates:
                lines += [f"The control arms fail gate {', '.join(s.control_gates)}. The starting policy scores "
                          f"{_f(s.start_dev)} on the same items; candidate minus it: {s.start_delta:+.3f} "
                          f"(95% CI [{s.start_ci_low:+.3f}, {s.start_ci_high:+.3f}]).", ""]
            lines += [f"- {t}" for t in s.trace]
            lines += [f"- **{f.severity}**{' **GATE**' if f.gate else ''} `{f.analyzer}` {f.message}"
                      for f in s.findings]
        return "\n".join(lines) + "\n"


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def paired_bootstrap(diffs: np.ndarray, n_boot: int = 2000, seed: int = 0) -> tuple[float, float, float, float]:
    """Mean paired difference over (seeds x items) and its bootstrap 95% interval and standard error.

    Two-level resampling: seeds with replacement, then items with replacement within each drawn seed, so the
    interval carries both the dev sampling error and the seed-to-seed spread of training.
    """
    diffs = np.asarray(diffs, dtype=float)
    n_seeds, n_items = diffs.shape
    rng = np.random.default_rng(seed)
    pick_seeds = rng.integers(0, n_seeds, size=(n_boot, n_seeds))
    means = np.empty(n_boot)
    for b in range(n_boot):
        items = rng.integers(0, n_items, size=(n_seeds, n_items))
        means[b] = diffs[pick_seeds[b][:, None], items].mean()
    lo, hi = np.quantile(means, [0.025, 0.975])
    return float(diffs.mean()), float(lo), float(hi), float(means.std(ddof=1))


def decide(delta: float, lo: float, hi: float, n_seeds: int, max_seeds: int, failed_gates: list[str]) -> str:
    """The sequential rule after a round: why to stop, or '' to extend by one seed.

    A failed gate stops at once; an interval above or below zero is decided; a non-positive estimate is not
    worth more budget; a positive one whose interval straddles zero is extended until `max_seeds`.
    """
    if failed_gates:
        return "gate"
    if lo > 0:
        return "significant"
    if hi < 0:
        return "worse"
    if delta <= 0:
        return "no_gain"
    return "budget" if n_seeds >= max_seeds else ""


def _replay_source(evidence: Path, generation: int) -> tuple[int | None, list[str]] | None:
    """Which stored rollouts a candidate of `generation` is replayed on: the champion line's evidence of the
    generation its diagnosis read, else any of the champion line's, else the control arms of this generation's
    short runs (the champion harness from the champion policy), else none."""
    if any((evidence / f"g{generation - 1}" / "main").glob("rollouts-*.parquet")):
        return generation - 1, ["main"]
    if any(evidence.glob("g*/main/rollouts-*.parquet")):
        return None, ["main"]
    if any((evidence / f"g{generation}" / "control").glob("rollouts-*.parquet")):
        return generation, ["control"]
    return None


def score_in_child(harness_dir: Path, evidence: Path, generation: int | None, branches: list[str], work: Path,
                   label: str, *, thresholds: dict | None = None, tags: list[str] | None = None,
                   rewards_only: bool = False, baseline_scale: str = "group") -> tuple[ReplaySpec, ReplayScores]:
    """A harness's code scores stored rollouts in an isolated child (`replay_scores`); only its scores come back."""
    import shutil

    from evotrainer.base.files import atomic_write_text
    from evotrainer.trainer import jobs
    from evotrainer.trainer.domains import get_domain
    from evotrainer.trainer.harness import load_spec
    from evotrainer.trainer.sandbox import Isolation, Limits

    stamp = uuid.uuid4().hex[:8]  # unique: several candidates may be replayed at once
    out = work / "specs" / f"replay-{stamp}"
    domain = get_domain(load_spec(harness_dir).domain)
    spec = ReplaySpec(harness_dir=str(harness_dir), evidence_root=str(evidence), generation=generation,
                      branches=branches, tags=tags, rewards_only=rewards_only, baseline_scale=baseline_scale,
                      thresholds=thresholds or {}, sealed_columns=list(getattr(domain, "evidence_columns", ())),
                      result_path=str(out / "scores.json"))
    spec_path = work / "specs" / f"replay-{stamp}.spec.json"
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(spec_path, spec.model_dump_json())
    try:
        jobs.run_child("evotrainer.trainer.backtest", [str(spec_path)], cwd=harness_dir,
                       log=work / "logs" / "replay.log", limits=Limits(timeout_s=600, memory_mb=8000), label=label,
                       isolation=Isolation(read=[str(harness_dir), str(evidence), str(spec_path)], write=[str(out)]))
        try:
            return spec, ReplayScores.model_validate_json(Path(spec.result_path).read_text())
        except (OSError, ValueError) as e:
            raise UserError(f"{label}: the replay child wrote no readable scores ({type(e).__name__})") from e
    finally:
        shutil.rmtree(out, ignore_errors=True)


def run_replay(harness_dir: Path, evidence: Path, generation: int | None, branches: list[str],
               thresholds: dict, work: Path, label: str, baseline_scale: str = "group") -> ReplayResult:
    """Replay a candidate: its code scores the stored rollouts in an isolated child, the rest is computed here."""
    started = time.time()
    spec, scores = score_in_child(harness_dir, evidence, generation, branches, work, label, thresholds=thresholds,
                                  baseline_scale=baseline_scale)
    return replay(spec, scores, time.time() - started)


_ARM_LOCKS: dict[str, threading.Lock] = {}
_ARM_LOCKS_GUARD = threading.Lock()


def _arm_lock(path: Path) -> threading.Lock:
    """One lock per arm directory: backtests of several candidates in threads share the control arms, and the
    second one to need an arm waits for the first to finish it instead of training it again."""
    with _ARM_LOCKS_GUARD:
        return _ARM_LOCKS.setdefault(str(path), threading.Lock())


class _Arms:
    """Trains and evaluates arms, each once: a finished arm (its checkpoint has meta.json) is reused, so the
    control is shared by every candidate of a generation and an interrupted backtest resumes."""

    def __init__(self, ws, domain: str, generation: int, start: Path, cfg: ShortRunConfig, fingerprint: str,
                 on_progress):
        self.ws, self.domain, self.generation, self.start, self.cfg = ws, domain, generation, start, cfg
        self.fingerprint, self.on_progress = fingerprint, on_progress

    def run(self, role: str, branch: str, commit: str, harness_dir: Path, seed: int):
        from evotrainer.trainer.evidence import branch_dir

        started = time.time()
        tag = arm_tag(commit, seed, self.cfg.steps)
        out = self.ws.path / "backtests" / f"g{self.generation}" / branch_dir(branch) / tag
        ckpt = out / "checkpoints" / "policy"
        with _arm_lock(out):
            return self._run(role, branch, commit, harness_dir, seed, out, ckpt, tag, started)

    def _run(self, role, branch, commit, harness_dir, seed, out, ckpt, tag, started):
        from evotrainer.trainer import jobs
        from evotrainer.trainer.evidence import read_rollouts
        from evotrainer.trainer.grpo import TrainSpec

        if not (ckpt / "meta.json").is_file():
            spec = TrainSpec(domain=self.domain, checkpoint=str(self.start), harness_dir=str(harness_dir),
                             steps=self.cfg.steps, seed=seed, out_dir=str(out), checkpoint_id="policy",
                             checkpoints_dir=str(out / "checkpoints"), evidence_dir=str(self.ws.path / "evidence"),
                             run=self.ws.path.name, generation=self.generation, branch=branch, harness_commit=commit,
                             evidence_tag=tag, result_path=str(out / "specs" / "train.result.json"))
            jobs.train(spec, out, on_progress=self.on_progress(f"{role} s{seed}") if self.on_progress else None)
        ev = jobs.evaluate(ckpt, self.domain, "dev", out, k=0, limit=self.cfg.dev_items, seed=seed,
                           expected_fingerprint=self.fingerprint)
        rows = read_rollouts(self.ws.path / "evidence", self.generation, branch, [tag]).to_pandas()
        arm = Arm(role=role, seed=seed, commit=commit, checkpoint=str(ckpt), dev_accuracy=ev.accuracy,
                  train_reward=float(rows["reward"].mean()), train_correct=float(rows["correct"].mean()),
                  seconds=round(time.time() - started, 1))
        return arm, np.array(ev.greedy_correct, dtype=float)


def short_run(ws, branch: str, commit: str, cand_dir: Path, champ_commit: str, champ_dir: Path, generation: int,
              start: Path, cfg: ShortRunConfig, thresholds: dict, on_progress=None) -> ShortRunResult:
    """Candidate vs control from the champion checkpoint, same seeds; sequential over seeds (DESIGN §7)."""
    from concurrent.futures import ThreadPoolExecutor

    from evotrainer.trainer.diagnostics.report import health_report

    started = time.time()
    arms = _Arms(ws, ws.config().domain, generation, start, cfg, ws.config().fingerprint, on_progress)
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
        delta, lo, hi, se = paired_bootstrap(diffs, cfg.bootstrap)
        cand_tags = [arm_tag(commit, s, cfg.steps) for s in seeds]  # exact: never a longer run's arms of the commit
        rep = health_report(ws.path / "evidence", generation, branch, cand_dir, ws.path, tag=cand_tags,
                            thresholds=thresholds)
        cross, cand_rows = both_harnesses(ws.path, generation, branch, cand_dir, champ_dir, cand_tags,
                                          [arm_tag(champ_commit, s, cfg.steps) for s in seeds])
        findings = rep.findings + divergence_gate(cross, cand_rows, lo, thresholds)
        note = f"{len(seeds)} seeds x {cfg.steps} steps: {delta:+.3f} [{lo:+.3f}, {hi:+.3f}], MDE {Z_POWER * se:.3f}"
        stopped = decide(delta, lo, hi, len(seeds), cfg.max_seeds, sorted({f.analyzer for f in findings if f.gate}))
        trace.append(f"{note} -> {stopped or 'extend by one seed'}")
        if stopped:
            break
        n += 1
    # the champion is judged by the same gates: a gate its own arms fail is one a candidate may repair
    ctrl_rep = health_report(ws.path / "evidence", generation, "control", champ_dir, ws.path,
                             tag=[arm_tag(champ_commit, s, cfg.steps) for s in seeds], thresholds=thresholds)
    vs_start: dict = {}
    if ctrl_rep.failed_gates:  # the champion's score is not one to beat: is the candidate at least where it started?
        from evotrainer.trainer import jobs

        ev = jobs.evaluate(start, ws.config().domain, "dev", ws.path / "backtests" / f"g{generation}", k=0,
                           limit=cfg.dev_items, seed=ws.config().seed,  # the train node's key: its cached score
                           expected_fingerprint=ws.config().fingerprint)
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
        mde=Z_POWER * se, train_reward_delta=float(np.mean([a.train_reward for a in cand]) -
                                                   np.mean([a.train_reward for a in ctrl])),
        train_correct_delta=float(np.mean([a.train_correct for a in cand]) - np.mean([a.train_correct for a in ctrl])),
        findings=findings, failed_gates=sorted({f.analyzer for f in findings if f.gate}),
        control_gates=sorted(set(ctrl_rep.failed_gates)), control_gate_keys=sorted(gate_keys(ctrl_rep.findings)),
        cross=cross, **vs_start, stopped=stopped, trace=trace,
        seconds=round(time.time() - started, 1),
        seconds_per_arm=round(float(np.mean([a.seconds for a in all_arms])), 1),
    )


def train_controls(run_dir: str | Path, generation: int, cfg: ShortRunConfig, seeds: list[int],
                   on_progress=None) -> list[Arm]:
    """The control arms of a generation's short runs (the champion harness from the champion policy), trained
    ahead: candidates backtested in parallel threads then find them done, or wait for them (one lock per arm)."""
    from evotrainer.workspaces.run import RunWorkspace

    ws = RunWorkspace.open(run_dir)
    cfg_run = ws.config()
    champ_commit, champ_dir = ws.snapshot("main")
    arms = _Arms(ws, cfg_run.domain, generation, ws.starting_policy(), cfg, cfg_run.fingerprint, on_progress)
    return [arms.run("control", "control", champ_commit, champ_dir, s)[0] for s in seeds]


def backtest(run_dir: str | Path, branch: str, *, replay_only: bool = False, cfg: ShortRunConfig | None = None,
             generation: int | None = None, on_progress=None, write: bool = True, screen: bool = True
             ) -> BacktestResult:
    """Replay and (unless `replay_only`) short-run backtest of one candidate branch of a run. With `screen`, the
    replay runs first where the champion line has stored rollouts, and a candidate it gates gets no short run.

    The result is written to reports/backtest-<branch>.json and .md only when every part succeeded; any
    failure (missing branch, no evidence, a crashing candidate) raises one UserError and writes nothing.
    """
    from evotrainer.base.files import atomic_write_text
    from evotrainer.trainer import jobs
    from evotrainer.trainer.evidence import branch_dir
    from evotrainer.trainer.harness import load_spec
    from evotrainer.workspaces.run import RunWorkspace

    started = time.time()
    cfg = cfg or ShortRunConfig()
    ws = RunWorkspace.open(run_dir)
    repo = ws.harness
    record = next((r for r in repo.lineage() if r.branch == branch), None)
    if record is None:
        known = ", ".join(r.branch for r in repo.lineage()) or "none yet"
        raise UserError(f"branch {branch!r} is not a candidate of run {ws.path} (candidates: {known})")
    commit, cand_dir = ws.snapshot(record.head)
    champ_commit, champ_dir = ws.snapshot("main")
    champ_spec = load_spec(champ_dir)
    thresholds = champ_spec.analyzers  # the champion's gates judge every candidate
    scale = champ_spec.trainer.get("scale_rewards", "group")
    problems = jobs.validate_harness(cand_dir, ws.path, label=f"candidate {branch}")
    if problems:
        raise UserError(f"candidate {branch} is invalid: {problems[0]}")
    evidence = ws.path / "evidence"
    gen = record.generation

    source = (generation, ["main"]) if generation is not None else _replay_source(evidence, gen)
    if replay_only and source is None:
        raise UserError(f"run {ws.path} has no stored rollouts of the champion line to replay on: train it first, "
                        "or drop --replay-only so the short run's control provides them")
    label = f"replay of {branch}"
    # the replay first where there are stored rollouts to replay: a candidate it gates costs no short run
    replay_result = run_replay(cand_dir, evidence, source[0], source[1], thresholds, ws.path, label, scale) \
        if source is not None else None
    short, start = None, ws.champion_checkpoint()
    if not replay_only and not (screen and replay_result and replay_result.failed_gates):
        start = ws.starting_policy(on_progress("warm-up (SFT, cached)") if on_progress else None)
        short = short_run(ws, branch, commit, cand_dir, champ_commit, champ_dir, gen, start, cfg, thresholds,
                          on_progress)
    if replay_result is None:  # the control arms are the champion harness's rollouts from the champion policy
        replay_result = run_replay(cand_dir, evidence, gen, ["control"], thresholds, ws.path, label, scale)
    gates = sorted(set(replay_result.failed_gates) | set(short.failed_gates if short else []))
    result = BacktestResult(run=str(ws.path), branch=branch, commit=commit, champion_commit=champ_commit,
                            generation=gen, start_checkpoint=str(start) if start else None, replay=replay_result,
                            short_run=short, failed_gates=gates, seconds=round(time.time() - started, 1))
    if write:
        stem = ws.path / "reports" / f"backtest-{branch_dir(branch)}"
        atomic_write_text(stem.with_suffix(".md"), result.markdown())
        atomic_write_text(stem.with_suffix(".json"), result.model_dump_json(indent=2))  # last: its presence = done
    return result


def main(argv: list[str]) -> int:
    """Child entry point: `python -m evotrainer.trainer.backtest SPEC.json` (cwd: the candidate's harness)."""
    spec = ReplaySpec.model_validate_json(Path(argv[0]).read_text())
    Path(spec.result_path).write_text(replay_scores(spec).model_dump_json())
    return 0


if __name__ == "__main__":
    from evotrainer.trainer.sandbox import child_main

    child_main(main)
    sys.exit(0)
