"""Replay (DESIGN §7): a candidate harness's rewards, group filters and analyzers on stored rollouts.

The candidate's code runs in an isolated child whose working directory is its harness
(`python -m evotrainer.trainer.backtest.replay SPEC.json`, `replay_scores`): the child returns only what the
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
import time
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from evotrainer.base.errors import UserError
from evotrainer.trainer.diagnostics import Finding
from evotrainer.trainer.evidence import read_rollouts, read_steps
from evotrainer.trainer.reward_gates import UnsealedShare, unsealed_gate, unsealed_share

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


SEVERITY = {"info": 0, "warning": 1, "critical": 2}


def defects(findings: list[Finding]) -> dict[str, str]:
    """The worst severity, warning or critical, at which findings other than gates show each metric
    (`analyzer/metric`): the defects a candidate may fix (`agents.critic.fixes_of`)."""
    out: dict[str, str] = {}
    for f in findings:
        if not f.gate and SEVERITY.get(f.severity, 0) > SEVERITY.get(out.get(_key(f), "info"), 0):
            out[_key(f)] = f.severity
    return out


def critical_defects(findings: list[Finding]) -> set[str]:
    """The metrics a diagnosis shows at critical severity, gates aside: the main line's defects a fix must fix."""
    return {k for k, sev in defects(findings).items() if sev == "critical"}


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


def replay_source(evidence: Path, generation: int) -> tuple[int | None, list[str]] | None:
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
    from evotrainer.trainer import jobs
    from evotrainer.trainer.domains import get_domain
    from evotrainer.trainer.harness import load_spec
    from evotrainer.trainer.sandbox import Limits

    domain = get_domain(load_spec(harness_dir).domain)
    spec = ReplaySpec(harness_dir=str(harness_dir), evidence_root=str(evidence), generation=generation,
                      branches=branches, tags=tags, rewards_only=rewards_only, baseline_scale=baseline_scale,
                      thresholds=thresholds or {}, sealed_columns=list(getattr(domain, "evidence_columns", ())),
                      result_path="")
    scores = jobs.call_child("evotrainer.trainer.backtest.replay", spec, ReplayScores, work=work, name="replay",
                             cwd=harness_dir, limits=Limits.by_cpu(1200, memory_mb=8000), label=label,
                             read=[str(harness_dir), str(evidence)])
    return spec, scores


def run_replay(harness_dir: Path, evidence: Path, generation: int | None, branches: list[str],
               thresholds: dict, work: Path, label: str, baseline_scale: str = "group") -> ReplayResult:
    """Replay a candidate: its code scores the stored rollouts in an isolated child, the rest is computed here."""
    started = time.time()
    spec, scores = score_in_child(harness_dir, evidence, generation, branches, work, label, thresholds=thresholds,
                                  baseline_scale=baseline_scale)
    return replay(spec, scores, time.time() - started)



if __name__ == "__main__":  # `python -m evotrainer.trainer.backtest.replay SPEC.json`, cwd: the candidate's harness
    from evotrainer.trainer.sandbox import serve_spec

    serve_spec(ReplaySpec, replay_scores)
