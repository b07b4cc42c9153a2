"""The built-in analyzers. Thresholds are starting points (DESIGN §11), overridable per harness."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd

from evotrainer.trainer.diagnostics import Finding, analyzer

EVIDENCE_IDS = 20


def _ids(rows: pd.DataFrame) -> list[str]:
    return rows["rollout_id"].head(EVIDENCE_IDS).tolist()


def _level(value: float, warning: float, critical: float | None = None, above: bool = True):
    """'critical', 'warning' or None for a value against thresholds (above: larger is worse)."""
    worse = (lambda a, b: a > b) if above else (lambda a, b: a < b)
    if critical is not None and worse(value, critical):
        return "critical", critical
    if worse(value, warning):
        return "warning", warning
    return None, warning


def _group_stats(r: pd.DataFrame) -> pd.DataFrame:
    g = r.groupby("group_id", sort=False)
    return pd.DataFrame({"std": g["reward"].std(ddof=0), "correct": g["correct"].mean()})


@analyzer("dead_groups", warning=0.30, critical=0.50)
def dead_groups(r: pd.DataFrame, s: pd.DataFrame, t: dict) -> list[Finding]:
    """Zero-variance groups: every completion of a prompt got the same reward, so GRPO's advantage is zero
    and the group teaches nothing. Reports the ratio, split into all-solved (too easy) and all-failed (too hard)."""
    gs = _group_stats(r)
    dead = gs["std"] < 1e-6
    ratio = float(dead.mean())
    sev, thr = _level(ratio, t["warning"], t["critical"])
    if not sev:
        return []
    easy, hard = float((dead & (gs["correct"] == 1)).mean()), float((dead & (gs["correct"] == 0)).mean())
    dead_ids = set(gs.index[dead])
    return [Finding(analyzer="dead_groups", metric="dead_group_ratio", value=ratio, threshold=thr, severity=sev,
                    message=f"{ratio:.0%} of groups have zero reward variance ({easy:.0%} all solved, "
                            f"{hard:.0%} all failed): their gradient is zero",
                    evidence=_ids(r[r["group_id"].isin(dead_ids)]))]


@analyzer("small_groups", warning=0.15, critical=0.30, low=0.2, high=0.8, largest=64)
def small_groups(r: pd.DataFrame, s: pd.DataFrame, t: dict) -> list[Finding]:
    """Groups too small for the pass rate: on a difficulty level solved between `low` and `high` of the time (p), a
    group of G independent samples is all right or all wrong with probability p^G + (1-p)^G. The value is the share
    of all groups expected dead that way, a property of the group size and the solve rates, not of how the samples
    happened to fall (a cold sampler kills groups too: `identical_samples`). When it fires, a second finding (info,
    `group_size_needed`) gives the size a larger group should have, as `update_size` gives the step a learning rate
    should take: the smallest group, up to `largest`, that keeps the value under the warning wherever those levels'
    solve rates move within `low`-`high` as the policy trains (each at the band's edge, where p^G + (1-p)^G is
    largest). A size chosen at today's rates alone is silenced only until they move: on code/cold_pairs groups of 4
    read 14% when chosen and 22% a generation later."""
    gs = _group_stats(r)
    gs["level"] = r.groupby("group_id", sort=False)["difficulty"].first()
    size = int(r.groupby("group_id", sort=False).size().median())
    p = gs["level"].map(r.groupby("difficulty")["correct"].mean())
    mid = p.between(t["low"], t["high"])

    def expected(g: int) -> float:  # the share of all groups dead by chance were the groups of g samples
        return float((p ** g + (1 - p) ** g).where(mid, 0.0).mean())

    frac = expected(size)
    sev, thr = _level(frac, t["warning"], t["critical"])
    if not sev:
        return []
    dead = mid & (gs["std"] < 1e-6)
    # the message states the value itself (each level at its own solve rate): the chance at the levels' mean rate
    # would read lower (p^G + (1-p)^G is convex), below the threshold the value crossed
    out = [Finding(analyzer="small_groups", metric="expected_dead_solvable_ratio", value=frac, threshold=thr,
                   severity=sev, message=f"groups of {size} are too small for the pass rate: {mid.mean():.0%} of "
                                         f"groups are on levels solved {t['low']:.0%}-{t['high']:.0%} of the time "
                                         f"(mean {float(p[mid].mean()):.0%}), and at those levels' solve rates "
                                         f"{frac:.0%} of all groups are expected dead by chance "
                                         f"({float(dead.mean()):.0%} were); groups of {2 * size}: "
                                         f"{expected(2 * size):.0%}",
                   evidence=_ids(r[r["group_id"].isin(set(gs.index[dead]))]))]

    def bound(g: int) -> float:  # the largest share groups of g could read while these levels stay in the band
        return float(mid.mean()) * max(q ** g + (1 - q) ** g for q in (t["low"], t["high"]))

    need = next((g for g in range(size + 1, int(t["largest"]) + 1) if bound(g) <= t["warning"]), None)
    if need is not None:
        out.append(Finding(analyzer="small_groups", metric="group_size_needed", value=need, severity="info",
                           message=f"groups of {need} keep the share under the {t['warning']:.0%} warning wherever "
                                   f"these levels' solve rates move within {t['low']:.0%}-{t['high']:.0%} (at most "
                                   f"{bound(need):.0%}; {expected(need):.0%} at today's rates)"))
    return out


@analyzer("reward_spread", warning=0.05)
def reward_spread(r: pd.DataFrame, s: pd.DataFrame, t: dict) -> list[Finding]:
    """Mean within-group reward standard deviation: when it is tiny, advantages are noise amplified by the
    group normalisation, even in groups that are not exactly dead."""
    spread = float(_group_stats(r)["std"].mean())
    sev, thr = _level(spread, t["warning"], above=False)
    if not sev:
        return []
    return [Finding(analyzer="reward_spread", metric="mean_group_reward_std", value=spread, threshold=thr,
                    severity=sev, message=f"mean within-group reward std is {spread:.3f}: little signal per group")]


@analyzer("truncation", warning=0.05, critical=0.10)
def truncation(r: pd.DataFrame, s: pd.DataFrame, t: dict) -> list[Finding]:
    """Completions cut off by the completion-length limit. With masking they get no gradient at all; without it
    they are scored as whatever the reward makes of half an answer. A too-short limit shows up here, not on dev."""
    frac = float(r["truncated"].mean())
    sev, thr = _level(frac, t["warning"], t["critical"])
    if not sev:
        return []
    masked = float(r["loss_masked"].mean())
    by = r.groupby("difficulty")["truncated"].mean()
    worst = int(by.idxmax())
    return [Finding(analyzer="truncation", metric="truncated_ratio", value=frac, threshold=thr, severity=sev,
                    message=f"{frac:.0%} of completions truncated ({masked:.0%} masked out of the loss); worst at "
                            f"difficulty {worst} ({by.max():.0%})",
                    evidence=_ids(r[r["truncated"]]))]


@analyzer("length_reward_correlation", warning=0.30, drift=0.5)
def length_reward_correlation(r: pd.DataFrame, s: pd.DataFrame, t: dict) -> list[Finding]:
    """Length gaming: within groups, longer completions earn more reward (correlation of group-centred length and
    reward). Also reports length drift: the relative change of mean length from the first to the last quarter of
    steps."""
    out = []
    centred_len = r["n_tokens"] - r.groupby("group_id")["n_tokens"].transform("mean")
    centred_rew = r["reward"] - r.groupby("group_id")["reward"].transform("mean")
    if centred_len.std() > 0 and centred_rew.std() > 0:
        corr = float(np.corrcoef(centred_len, centred_rew)[0, 1])
        sev, thr = _level(corr, t["warning"])
        if sev:
            out.append(Finding(analyzer="length_reward_correlation", metric="length_reward_corr", value=corr,
                               threshold=thr, severity=sev,
                               message=f"within groups, longer completions earn more reward (r={corr:.2f})",
                               evidence=_ids(r[(centred_len > 0) & (centred_rew > 0)])))
    steps = r["step"]
    if steps.nunique() >= 4:
        q1, q4 = steps.quantile(0.25), steps.quantile(0.75)
        first, last = r.loc[steps <= q1, "n_tokens"].mean(), r.loc[steps >= q4, "n_tokens"].mean()
        drift = float((last - first) / max(first, 1.0))
        if abs(drift) > t["drift"]:
            out.append(Finding(analyzer="length_reward_correlation", metric="length_drift", value=drift,
                               threshold=t["drift"], severity="warning",
                               message=f"mean completion length moved {drift:+.0%} ({first:.1f} -> {last:.1f} tokens)"))
    return out


@analyzer("logprob_collapse", warning=-0.05)
def logprob_collapse(r: pd.DataFrame, s: pd.DataFrame, t: dict) -> list[Finding]:
    """Exploration collapse: the mean token log-probability of sampled completions near zero means the policy
    samples almost deterministically, so groups stop differing and learning stalls."""
    lp = float(r["mean_logprob"].mean())
    sev, thr = _level(lp, t["warning"])
    if not sev:
        return []
    return [Finding(analyzer="logprob_collapse", metric="mean_token_logprob", value=lp, threshold=thr, severity=sev,
                    message=f"mean token log-probability {lp:.3f}: the policy has nearly stopped exploring",
                    evidence=_ids(r.nlargest(EVIDENCE_IDS, "mean_logprob")))]


@analyzer("identical_samples", warning=0.45, critical=0.55)
def identical_samples(r: pd.DataFrame, s: pd.DataFrame, t: dict) -> list[Finding]:
    """A sampler that explores nothing: how often two samples of the same prompt are the very same completion (the
    within-group pair collision rate, which does not depend on the group size). A temperature well below 1 or a
    policy collapsed onto one answer drives it up, and such groups are dead whether the answer is right or wrong.
    A healthy math policy sampled at temperature 1 measured 0.29-0.37 over its first 67 GRPO steps."""
    counts = r.groupby(["group_id", "completion"], sort=False).size()
    sizes = counts.groupby(level=0).sum()
    pairs = (counts * (counts - 1)).groupby(level=0).sum() / (sizes * (sizes - 1)).clip(lower=1)
    frac = float(pairs[sizes > 1].mean()) if (sizes > 1).any() else 0.0
    sev, thr = _level(frac, t["warning"], t["critical"])
    if not sev:
        return []
    same = pairs.index[pairs >= 1.0]
    return [Finding(analyzer="identical_samples", metric="within_group_collision_rate", value=frac, threshold=thr,
                    severity=sev, message=f"two samples of the same prompt are the same completion {frac:.0%} of the "
                                          f"time ({len(same) / max(len(pairs), 1):.0%} of groups sampled one "
                                          "completion only): the sampler explores little",
                    evidence=_ids(r[r["group_id"].isin(set(same))]))]


@analyzer("format_failures", warning=0.30)
def format_failures(r: pd.DataFrame, s: pd.DataFrame, t: dict) -> list[Finding]:
    """Completions whose final answer the sealed parser cannot read (column `formatted`). They are wrong whatever
    they compute; a format reward may help, or hide the real problem."""
    if "formatted" not in r:
        return []
    frac = float(1 - r["formatted"].mean())
    sev, thr = _level(frac, t["warning"])
    if not sev:
        return []
    by = 1 - r.groupby("difficulty")["formatted"].mean()
    return [Finding(analyzer="format_failures", metric="format_failure_ratio", value=frac, threshold=thr,
                    severity=sev, message=f"{frac:.0%} of completions give no readable final answer (worst: "
                                          f"difficulty {int(by.idxmax())}, {by.max():.0%})",
                    evidence=_ids(r[~r["formatted"].astype(bool)]))]


@analyzer("repetition", warning=0.10, repeats=4)
def repetition(r: pd.DataFrame, s: pd.DataFrame, t: dict) -> list[Finding]:
    """Degenerate loops: completions in which a chunk of 2+ characters repeats `repeats` times in a row."""
    n = int(t["repeats"]) - 1
    with warnings.catch_warnings():  # the back-reference needs a group; pandas warns about groups in contains()
        warnings.simplefilter("ignore", UserWarning)
        looped = r["completion"].str.contains(rf"(.{{2,}}?)\1{{{n},}}", regex=True)
    frac = float(looped.mean())
    sev, thr = _level(frac, t["warning"])
    if not sev:
        return []
    return [Finding(analyzer="repetition", metric="repetition_ratio", value=frac, threshold=thr, severity=sev,
                    message=f"{frac:.0%} of completions repeat a chunk {int(t['repeats'])}+ times",
                    evidence=_ids(r[looped]))]


def _components(r: pd.DataFrame) -> list[str]:
    return [c for c in r.columns if c.startswith("reward_")]


@analyzer("component_dominance", share=0.8, agreement=0.5)
def component_dominance(r: pd.DataFrame, s: pd.DataFrame, t: dict) -> list[Finding]:
    """One reward component dominating the total's variance while it agrees poorly with `correct`: the policy is
    optimising that component, not the task."""
    comps = _components(r)
    if len(comps) < 2 or r["reward"].var() == 0:
        return []
    x = r[comps].to_numpy(dtype=float)
    weights, *_ = np.linalg.lstsq(x, r["reward"].to_numpy(dtype=float), rcond=None)  # total = sum w_c r_c
    total = r["reward"].to_numpy(dtype=float)
    correct = r["correct"].to_numpy(dtype=float)
    out = []
    for i, c in enumerate(comps):
        part = weights[i] * x[:, i]
        share = float(np.cov(part, total)[0, 1] / total.var(ddof=1))
        agree = float(np.corrcoef(x[:, i], correct)[0, 1]) if x[:, i].std() > 0 and correct.std() > 0 else 0.0
        if share > t["share"] and agree < t["agreement"]:
            out.append(Finding(analyzer="component_dominance", metric=f"{c}_variance_share", value=share,
                               threshold=t["share"], severity="warning",
                               message=f"{c} carries {share:.0%} of the reward variance but agrees with the sealed "
                                       f"score only at r={agree:.2f}"))
    return out


@analyzer("shaped_vs_sealed", rise=0.05, flat=0.0)
def shaped_vs_sealed(r: pd.DataFrame, s: pd.DataFrame, t: dict) -> list[Finding]:
    """The reward-hacking gate: the total reward (or a component) rose from the first to the last third of steps
    while the sealed `correct` stayed flat or fell. A shaped reward that stops tracking correctness must never be
    promoted, whatever the train curve says."""
    steps = r["step"]
    if steps.nunique() < 3:
        return []
    lo, hi = steps.quantile(1 / 3), steps.quantile(2 / 3)
    first, last = r[steps <= lo], r[steps >= hi]
    d_correct = float(last["correct"].mean() - first["correct"].mean())
    out = []
    for col in ["reward", *_components(r)]:
        d = float(last[col].mean() - first[col].mean())
        if d > t["rise"] and d_correct <= t["flat"]:
            hacked = last[(last[col] >= last[col].median()) & ~last["correct"].astype(bool)]
            out.append(Finding(analyzer="shaped_vs_sealed", metric=f"{col}_rise_while_correct_flat", value=d,
                               threshold=t["rise"], severity="critical", gate=True,
                               message=f"{col} rose {d:+.3f} while the sealed correct rate moved {d_correct:+.3f}: "
                                       "the reward no longer tracks correctness",
                               evidence=_ids(hacked)))
    return out


@analyzer("unpaid_correct", warning=0.10, critical=0.30, min_correct=20)
def unpaid_correct(r: pd.DataFrame, s: pd.DataFrame, t: dict) -> list[Finding]:
    """Right answers the reward does not pay: rollouts the sealed scorer grades correct whose reward is no higher
    than the mean reward of the wrong ones. The reward code cannot read them (a parser or a format gate stricter
    than the task), so the very behaviour the task wants gets a zero or negative advantage. Needs `min_correct`
    correct rollouts to judge; names the reward component that misses most."""
    right = r[r["correct"].astype(bool)]
    wrong = r[~r["correct"].astype(bool)]
    if len(right) < t["min_correct"] or wrong.empty:
        return []
    unpaid = right["reward"] <= wrong["reward"].mean() + 1e-6
    frac = float(unpaid.mean())
    sev, thr = _level(frac, t["warning"], t["critical"])
    if not sev:
        return []
    # the component that withholds most: its weight in the total (least squares, as component_dominance) times
    # how much less it pays the unpaid right answers than the paid ones (or than its best, when none is paid)
    comps, worst, gap = _components(r), "reward", 0.0
    if comps:
        weights, *_ = np.linalg.lstsq(r[comps].to_numpy(dtype=float), r["reward"].to_numpy(dtype=float), rcond=None)
        for w, c in zip(weights, comps):
            ref = right.loc[~unpaid, c].mean() if (~unpaid).any() else r[c].max()
            d = float(w * (ref - right.loc[unpaid, c].mean()))
            if d > gap:
                worst, gap = c, d
    levels = right.loc[unpaid, "difficulty"].value_counts(normalize=True)
    where = ", ".join(f"difficulty {int(k)}: {v:.0%}" for k, v in levels.head(3).items())
    return [Finding(analyzer="unpaid_correct", metric=f"{worst}_unpaid_correct", value=frac, threshold=thr,
                    severity=sev, message=f"{frac:.0%} of the {len(right)} rollouts the sealed scorer grades correct "
                                          f"earn no more reward than the wrong ones ({where}); {worst} withholds "
                                          f"most ({gap:.2f} of reward each): the reward cannot read these right "
                                          "answers", evidence=_ids(right[unpaid]))]


@analyzer("solve_rate_by_difficulty", too_easy=0.95, too_hard=0.02)
def solve_rate_by_difficulty(r: pd.DataFrame, s: pd.DataFrame, t: dict) -> list[Finding]:
    """Sealed solve rate per difficulty level: levels almost always solved waste compute, levels never solved
    give no signal; both become dead groups. A curriculum or a data filter acts on this.

    A rate is judged only on enough rollouts of the level: n >= 3 / threshold (the rule of three: with no solve in
    n rollouts the 95% upper bound of the rate is 3/n), so 150 for "below 2%", 60 for "above 95%"; a level that
    looks beyond a threshold on fewer is reported as info, saying how many it would need."""
    out = []
    rates = r.groupby("difficulty")["correct"].mean()
    counts = r.groupby("difficulty").size()
    share = counts / len(r)
    for level, rate in rates.items():
        for kind, cond, thr, margin in (("too easy", rate > t["too_easy"], t["too_easy"], 1 - t["too_easy"]),
                                        ("too hard", rate < t["too_hard"], t["too_hard"], t["too_hard"])):
            need = math.ceil(3 / margin)
            if cond and counts[level] < need:
                side = "above" if kind == "too easy" else "below"
                out.append(Finding(analyzer="solve_rate_by_difficulty", metric=f"solve_rate_d{level}",
                                   value=float(rate), threshold=thr, severity="info",
                                   message=f"difficulty {level}: solve rate {rate:.0%} on only {counts[level]} "
                                           f"rollouts, too few to judge it {side} {thr:.0%} (needs {need})",
                                   evidence=[]))
            elif cond:
                rows = r[r["difficulty"] == level]
                out.append(Finding(analyzer="solve_rate_by_difficulty", metric=f"solve_rate_d{level}",
                                   value=float(rate), threshold=thr, severity="warning" if kind == "too hard"
                                   else "info", message=f"difficulty {level} is {kind}: solve rate {rate:.0%} on "
                                                        f"{share[level]:.0%} of rollouts", evidence=_ids(rows)))
    return out


@analyzer("update_size", warning=3e-4, critical=1.5e-4)
def update_size(r: pd.DataFrame, s: pd.DataFrame, t: dict) -> list[Finding]:
    """Updates too small to learn from: the median over steps of how far an optimizer step moves the weights
    relative to their size (||dw|| / ||w||, the steps' `update_ratio`). Nothing else shows a learning rate that is
    too low: groups, rewards and lengths look normal, the reward only creeps. Calibrated on the ~1M-parameter CPU
    policy (lr 1e-4: 0.9-2e-3 over its first steps; lr 1e-5: 1-2e-4); a pretrained model fine-tuned with RL moves
    far less per step by design, so set this analyzer's thresholds in its harness. A step whose groups were all dead
    (`frac_zero_std` 1: every advantage zero) moves nothing whatever the rate, so it is not counted: a harness that
    starves the gradient is `dead_groups`' finding, not a learning rate's."""
    if s is None or "update_ratio" not in s:
        return []
    measured = s["update_ratio"].notna()
    if "frac_zero_std" in s:
        measured &= ~(s["frac_zero_std"] >= 1.0)
    if measured.sum() < 3:
        return []
    ratio = float(s.loc[measured, "update_ratio"].median())
    sev, thr = _level(ratio, t["warning"], t["critical"], above=False)
    if not sev:
        return []
    return [Finding(analyzer="update_size", metric="median_update_ratio", value=ratio, threshold=thr, severity=sev,
                    message=f"each optimizer step moves the weights by {ratio:.1e} of their norm (median of "
                            f"{int(measured.sum())} steps; a healthy run of this policy moves "
                            f"~1e-3): the updates are too small to learn much")]


@analyzer("optimizer_health", kl=0.5, clip_ratio=0.2, grad_spike=10.0)
def optimizer_health(r: pd.DataFrame, s: pd.DataFrame, t: dict) -> list[Finding]:
    """KL to the reference, clipped-ratio fraction and grad-norm spikes from the per-step aggregates: large
    values mean updates too big for the trust region the recipe assumes."""
    out = []
    if s is None or s.empty:
        return out
    if "kl" in s and s["kl"].notna().any() and s["kl"].max() > t["kl"]:
        out.append(Finding(analyzer="optimizer_health", metric="max_kl", value=float(s["kl"].max()),
                           threshold=t["kl"], severity="warning",
                           message=f"KL reached {s['kl'].max():.3f} at step {int(s.loc[s['kl'].idxmax(), 'step'])}"))
    if "clip_ratio" in s and s["clip_ratio"].mean() > t["clip_ratio"]:
        out.append(Finding(analyzer="optimizer_health", metric="mean_clip_ratio", value=float(s["clip_ratio"].mean()),
                           threshold=t["clip_ratio"], severity="warning",
                           message=f"{s['clip_ratio'].mean():.0%} of tokens clipped on average"))
    if "grad_norm" in s and len(s) >= 5:
        med, top = float(s["grad_norm"].median()), float(s["grad_norm"].max())
        if med > 0 and top > t["grad_spike"] * med:
            out.append(Finding(analyzer="optimizer_health", metric="grad_norm_spike", value=top / med,
                               threshold=t["grad_spike"], severity="warning",
                               message=f"grad norm spiked to {top:.2f} ({top / med:.0f}x the median) at step "
                                       f"{int(s.loc[s['grad_norm'].idxmax(), 'step'])}"))
    return out
