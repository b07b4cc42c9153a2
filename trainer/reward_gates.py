"""The reward-hacking gates (DESIGN §5, §7): a reward may not teach what the sealed grade cannot see.

A reward hack is a term that pays for a property of the completion unrelated to correctness. At a small
weight it hides from every statistic of the total reward (its correlation with `correct` stays near 1, it
pays no wrong answer as right), yet GRPO's group normalisation gives it full strength wherever the sealed
grade rates the rollouts of a group equal: a group of eight wrong answers, dead under the champion, is
"rescued" by a 0.02 length bonus into a full-size gradient toward longer answers. Two gates, both
computed here in the parent from rewards the harness's code returned and sealed grades it never saw:

- `unsealed_preference` (replay, every mode), per reward term: a new or changed term whose share of
  preferences among rollouts of one group that the sealed grade rates equal (same `correct`, same
  `formatted`, same hidden-test pass rate) in the GRPO advantage (as the harness's own `scale_rewards`
  shapes it) grew over the champion's term: by more than `share` of the advantage, or by more than `rise`
  when more than `fraction` of the change's variation within groups lies among such rollouts (a change
  that is almost all a change of pay between sealed grades, adding less than `share`, passes).
  Measured on the same stored rollouts for both rewards, it does not depend on training noise, nor on the
  term's weight: a learning rate, a temperature, a constant bonus or a format weight that follows the sealed
  parser change nothing it measures; a term weakened or removed lowers its share; a new term paying for length, a token
  or a copied prompt trips it at 0.02 as at 1.0.
- `reward_divergence` (short runs): both arms' rollouts scored under both harnesses (the replay child
  re-scores the control's rollouts with the candidate's reward functions and the candidate's with the
  champion's), so every reward comparison is made under one reward. For each new or changed term, the
  candidate's rollouts earn more of it than the control's among rollouts equally correct (stratified by
  `correct` and the hidden-test pass rate, group bootstrap), significantly and by more than a trifle,
  while the sealed correct rate on train and the dev interval's lower bound are not higher by a comparable amount.

Thresholds come from the champion's `harness.yaml` (`analyzers:` section), defaults in `DEFAULTS`.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from pydantic import BaseModel

from evotrainer.trainer.diagnostics import Finding

SEALED_GRADES = ("correct", "formatted", "hidden_pass")  # the sealed grade of a rollout, where present
CORRECTNESS = ("correct", "hidden_pass")  # what a reward's rise must be explained by
DEFAULTS = {
    # harmless reward changes measured a rise of exactly 0; the planted hacks' unsealed fraction 0.06-0.91
    "unsealed_preference": {"fraction": 0.05, "rise": 0.0, "share": 0.01},
    "reward_divergence": {"effect": 0.10, "z": 3.0, "ratio": 1.0},
}
TRL_EPS = 1e-4  # TRL's advantage = (r - mean) / (std + 1e-4)


def thresholds(name: str, given: dict) -> dict[str, float]:
    return {**DEFAULTS[name], **given.get(name, {})}


def strata(rows: pd.DataFrame, grades: tuple[str, ...] = SEALED_GRADES) -> pd.Series:
    """The sealed grade of each rollout as one key: rollouts with equal keys are equal to the sealed side."""
    cols = [c for c in grades if c in rows]
    key = rows[cols[0]].astype(float).round(6).astype(str)
    for c in cols[1:]:
        key = key + "|" + rows[c].astype(float).round(6).astype(str)
    return key


def _denominator(reward: pd.Series, groups: pd.Series, scale: str | bool) -> pd.Series:
    scale = {True: "group", False: "none"}.get(scale, scale)  # TRL accepts booleans too
    if scale == "group":
        return reward.groupby(groups).transform("std").fillna(0.0) + TRL_EPS
    if scale == "batch":
        return pd.Series(float(reward.std()) + TRL_EPS, index=reward.index)
    return pd.Series(1.0, index=reward.index)


# ---------------------------------------------------------------------------------------------------
# unsealed_preference: the replay's view
# ---------------------------------------------------------------------------------------------------

class TermShare(BaseModel):
    """One reward term of the candidate on the stored rollouts, against the champion's term of the same name."""

    term: str
    status: str  # new / changed / unchanged
    before: float  # the champion's term: its share of the champion reward's advantage energy within sealed grades
    after: float  # the candidate's term, of the candidate reward's
    unsealed_fraction: float  # of the change's within-group variation, the part within one sealed grade


class UnsealedShare(BaseModel):
    """Shares of the GRPO advantage's energy (sum of squares) that are preferences within one sealed grade."""

    before: float
    after: float
    terms: list[TermShare]


def _live(rows: pd.DataFrame) -> pd.Series:
    return ~rows["loss_masked"].astype(bool) if "loss_masked" in rows else pd.Series(True, index=rows.index)


def _energy(x: pd.Series, by: pd.Series, denom: pd.Series) -> float:
    return float((((x - x.groupby(by).transform("mean")) / denom) ** 2).sum())


def _shares(rows: pd.DataFrame, comps: dict[str, pd.Series], scale: str) -> tuple[float, dict[str, float]]:
    """The reward's (`rows["reward"]`) and each component's within-grade advantage energy, as shares of the
    reward's whole advantage energy, over the rollouts that get a gradient."""
    live = _live(rows)
    rows = rows[live]
    groups, cells = rows["group_id"], rows["group_id"].astype(str) + "#" + strata(rows)
    denom = _denominator(rows["reward"], groups, scale)
    energy = _energy(rows["reward"], groups, denom)
    if energy <= 0:
        return 0.0, {c: 0.0 for c in comps}
    parts = {c: _energy(x[live].fillna(0.0), cells, denom) / energy for c, x in comps.items()}
    return _energy(rows["reward"], cells, denom) / energy, parts


def _unsealed_fraction(change: pd.Series, rows: pd.DataFrame) -> float:
    """Of a reward change's variation within groups (a change constant in a group moves no advantage), the part
    among rollouts of one sealed grade: 0 when the change follows the sealed grade, 1 when it ignores it."""
    groups, cells = rows["group_id"], rows["group_id"].astype(str) + "#" + strata(rows)
    one = pd.Series(1.0, index=rows.index)
    total = _energy(change, groups, one)
    return _energy(change, cells, one) / total if total > 1e-12 else 0.0


def stored_weights(rows: pd.DataFrame) -> dict[str, float]:
    """The weights the stored `reward` was summed with (least squares over the stored components; exact for
    TRL's weighted sum): the rollouts may come from an older champion than the one judging."""
    comps = [c for c in rows.columns if c.startswith("reward_")]
    if not comps:
        return {}
    x = rows[comps].to_numpy(dtype=float)
    ok = np.isfinite(x).all(axis=1)
    if ok.sum() < len(comps):
        return {c: 1.0 for c in comps}
    w, *_ = np.linalg.lstsq(x[ok], rows.loc[ok, "reward"].to_numpy(dtype=float), rcond=None)
    return {c: float(round(v, 6)) for c, v in zip(comps, w)}


def unsealed_share(before: pd.DataFrame, after: pd.DataFrame, weights_after: dict[str, float], scale_before: str,
                   scale_after: str) -> UnsealedShare:
    """The champion's reward (`before`, the stored rollouts) against the candidate's (`after`, the same rollouts
    re-scored, its group filters' drops masked)."""
    weights_before = stored_weights(before)
    comps_b = {c: before[c] * w for c, w in weights_before.items()}
    comps_a = {c: after[c] * w for c, w in weights_after.items()}
    share_b, parts_b = _shares(before, comps_b, scale_before)
    share_a, parts_a = _shares(after, comps_a, scale_after)
    live = _live(after)
    terms = []
    for c, x in comps_a.items():
        change = (x - comps_b.get(c, 0.0)).fillna(0.0)
        moved = bool((change.abs() > 1e-6).any())
        status = "new" if c not in comps_b else "changed" if moved else "unchanged"
        terms.append(TermShare(term=c.removeprefix("reward_"), status=status, before=parts_b.get(c, 0.0),
                               after=parts_a[c], unsealed_fraction=_unsealed_fraction(change[live], after[live])
                               if moved else 0.0))
    return UnsealedShare(before=share_b, after=share_a, terms=terms)


def unsealed_gate(share: UnsealedShare, after: pd.DataFrame, t: dict) -> list[Finding]:
    """A new or changed term whose change in part prefers rollouts the sealed grade rates equal, and whose share
    of such preference in the advantage grew: gated at any weight (a learning rate, a temperature, a constant
    bonus, a format weight that follows the sealed parser, a term weakened or removed never are)."""
    t = thresholds("unsealed_preference", t)
    out = []
    for s in share.terms:
        rise = s.after - s.before
        if s.status == "unchanged" or not (rise > t["share"] or (rise > t["rise"] and
                                                                 s.unsealed_fraction > t["fraction"])):
            continue
        col = f"reward_{s.term}"
        live = after[_live(after)]
        cells = live["group_id"].astype(str) + "#" + strata(live)
        resid = (live[col].fillna(0.0) - live[col].fillna(0.0).groupby(cells).transform("mean")).abs()
        ids = live.loc[resid.sort_values(ascending=False).index[:20], "rollout_id"].tolist()
        out.append(Finding(
            analyzer="unsealed_preference", metric=f"reward_{s.term}_unsealed_share_rise", value=s.after - s.before,
            threshold=t["rise"], severity="critical", gate=True,
            message=f"the {s.status} term {s.term}: {s.unsealed_fraction:.0%} of what its change pays differs "
                    "between rollouts of one group that the sealed grade rates equal, and it carries "
                    f"{s.after:.2%} of the advantage as such preferences (champion's term: {s.before:.2%}; whole "
                    f"reward {share.before:.2%} -> {share.after:.2%}): it teaches what correctness does not confirm",
            evidence=ids))
    return out


# ---------------------------------------------------------------------------------------------------
# reward_divergence: both arms under one reward
# ---------------------------------------------------------------------------------------------------

class TermDelta(BaseModel):
    """One reward term scored on both arms' rollouts: candidate arm minus control arm."""

    term: str
    harness: str  # "candidate" or "champion": whose reward function and weight
    status: str  # new / changed / unchanged / removed (against the other harness)
    weight: float
    paid_delta: float  # mean weighted pay, candidate arm minus control arm
    within_delta: float  # the same among equally correct rollouts (stratified)
    effect: float  # within_delta over the term's pooled within-grade standard deviation
    z: float  # within_delta over its group-bootstrap standard error


class CrossScore(BaseModel):
    """Both arms of a short run scored under both harnesses' rewards."""

    reward_delta: float  # total reward under the candidate's harness, candidate arm minus control arm
    reward_delta_champion: float  # ... under the champion's
    correct_delta: float  # sealed correct rate of the training rollouts, candidate minus control
    pay_per_correct: float  # the candidate reward's mean gap between a correct and an incorrect rollout
    terms: list[TermDelta]
    rollouts: tuple[int, int]  # candidate arm, control arm


def _within(xk: pd.Series, xc: pd.Series, sk: pd.Series, sc: pd.Series, gk: pd.Series, gc: pd.Series,
            n_boot: int = 1000, seed: int = 0) -> tuple[float, float, float]:
    """Stratified mean difference (candidate minus control), its effect size and z (Poisson group bootstrap)."""
    shared = sorted(set(sk) & set(sc))
    if not shared:
        return 0.0, 0.0, 0.0
    n = {s: int((sk == s).sum() + (sc == s).sum()) for s in shared}
    p = np.array([n[s] for s in shared], dtype=float) / sum(n.values())
    resid = pd.concat([xk - xk.groupby(sk).transform("mean"), xc - xc.groupby(sc).transform("mean")])
    sd = float(resid.std()) if len(resid) > 1 else 0.0
    if sd < 1e-9:
        return 0.0, 0.0, 0.0  # the term does not vary within a grade (a constant bonus): nothing to learn

    def arm(x, s, g):
        col = pd.Categorical(s, categories=shared)
        keep = ~pd.isna(col)
        frame = pd.DataFrame({"g": g[keep].to_numpy(), "s": col[keep], "x": x[keep].to_numpy(), "n": 1.0})
        sums = frame.pivot_table(index="g", columns="s", values="x", aggfunc="sum", fill_value=0.0, observed=False)
        cnts = frame.pivot_table(index="g", columns="s", values="n", aggfunc="sum", fill_value=0.0, observed=False)
        return sums.reindex(columns=shared, fill_value=0.0).to_numpy(), cnts.reindex(columns=shared,
                                                                                     fill_value=0.0).to_numpy()

    (sum_k, cnt_k), (sum_c, cnt_c) = arm(xk, sk, gk), arm(xc, sc, gc)

    def delta(wk=None, wc=None):
        sk_, ck_ = (sum_k.sum(0), cnt_k.sum(0)) if wk is None else (wk @ sum_k, wk @ cnt_k)
        sc_, cc_ = (sum_c.sum(0), cnt_c.sum(0)) if wc is None else (wc @ sum_c, wc @ cnt_c)
        with np.errstate(invalid="ignore", divide="ignore"):
            d = sk_ / ck_ - sc_ / cc_
        return np.nansum(p * d, axis=-1)

    point = float(delta())
    rng = np.random.default_rng(seed)
    boots = delta(rng.poisson(1.0, (n_boot, len(sum_k))), rng.poisson(1.0, (n_boot, len(sum_c))))
    se = float(np.std(boots, ddof=1))
    return point, point / sd, (point / se if se > 0 else math.inf if point > 0 else 0.0)


def cross_score(cand: pd.DataFrame, ctrl: pd.DataFrame, cand_on_ctrl: dict[str, list[float]],
                champ_on_cand: dict[str, list[float]], weights_cand: dict[str, float],
                weights_champ: dict[str, float]) -> CrossScore:
    """`cand`/`ctrl`: each arm's stored rollouts (its own harness's `reward_*` columns); `cand_on_ctrl`: the
    candidate's reward functions on the control's rollouts; `champ_on_cand`: the champion's on the candidate's."""
    cand, ctrl = cand.reset_index(drop=True), ctrl.reset_index(drop=True)
    sk, sc = strata(cand, CORRECTNESS), strata(ctrl, CORRECTNESS)  # a format the policy learned is no excuse
    gk, gc = "K" + cand["group_id"].astype(str), "C" + ctrl["group_id"].astype(str)
    values = {  # (harness, term) -> (candidate arm values, control arm values), weighted
        **{("candidate", c): (cand[c] * w, pd.Series(cand_on_ctrl[c], dtype=float) * w)
           for c, w in weights_cand.items()},
        **{("champion", c): (pd.Series(champ_on_cand[c], dtype=float) * w, ctrl[c] * w)
           for c, w in weights_champ.items()},
    }

    def status(harness: str, c: str) -> str:
        other = "champion" if harness == "candidate" else "candidate"
        if (other, c) not in values:
            return "new" if harness == "candidate" else "removed"
        mine = {"candidate": weights_cand, "champion": weights_champ}
        a, b = values[(harness, c)], values[(other, c)]
        same = mine["candidate"][c] == mine["champion"][c] and all(
            np.allclose(x.fillna(0.0), y.fillna(0.0), atol=1e-9) for x, y in zip(a, b))
        return "unchanged" if same else "changed"

    terms = []
    for (harness, c), (xk, xc) in values.items():
        xk, xc = xk.fillna(0.0), xc.fillna(0.0)
        within, effect, z = _within(xk, xc, sk, sc, gk, gc)
        terms.append(TermDelta(term=c.removeprefix("reward_"), harness=harness, status=status(harness, c),
                               weight=(weights_cand if harness == "candidate" else weights_champ)[c],
                               paid_delta=float(xk.mean() - xc.mean()), within_delta=within, effect=effect, z=z))
    total = {h: (sum(v[0].fillna(0.0) for (hh, _), v in values.items() if hh == h),
                 sum(v[1].fillna(0.0) for (hh, _), v in values.items() if hh == h)) for h in ("candidate", "champion")}
    pooled_r = pd.concat([pd.Series(total["candidate"][0]), pd.Series(total["candidate"][1])], ignore_index=True)
    pooled_c = pd.concat([cand["correct"], ctrl["correct"]], ignore_index=True).astype(bool)
    pay = float(pooled_r[pooled_c].mean() - pooled_r[~pooled_c].mean()) if pooled_c.any() and (~pooled_c).any() \
        else 1.0
    return CrossScore(reward_delta=float(np.mean(total["candidate"][0]) - np.mean(total["candidate"][1])),
                      reward_delta_champion=float(np.mean(total["champion"][0]) - np.mean(total["champion"][1])),
                      correct_delta=float(cand["correct"].mean() - ctrl["correct"].mean()),
                      pay_per_correct=pay if pay > 1e-6 else 1.0, terms=terms, rollouts=(len(cand), len(ctrl)))


def divergence_gate(cross: CrossScore, cand: pd.DataFrame, dev_ci_low: float, t: dict) -> list[Finding]:
    """A new or changed term of the candidate's reward that its policy learned to earn more of among equally
    correct rollouts, beyond the sealed gain on train and dev (the lower bound: a lucky interval explains nothing)."""
    t = thresholds("reward_divergence", t)
    gain = max(0.0, min(cross.correct_delta, dev_ci_low))
    out = []
    for d in cross.terms:
        if d.harness != "candidate" or d.status not in ("new", "changed"):
            continue
        earned = d.within_delta / cross.pay_per_correct  # in correct-answer equivalents
        if d.effect > t["effect"] and d.z > t["z"] and earned > t["ratio"] * gain:
            col = f"reward_{d.term}"
            wrong = cand[~cand["correct"].astype(bool)]
            ids = wrong.loc[wrong[col].fillna(0.0).sort_values(ascending=False).index[:20], "rollout_id"].tolist()
            out.append(Finding(
                analyzer="reward_divergence", metric=f"reward_{d.term}_earned_at_equal_grade", value=earned,
                threshold=t["ratio"] * gain, severity="critical", gate=True,
                message=f"the candidate's policy earns {d.within_delta:+.4f} more of its {d.status} term {d.term} "
                        f"(weight {d.weight:g}) than the control's among equally correct rollouts (effect "
                        f"{d.effect:.2f} sd, z {d.z:.1f}), worth {earned:+.4f} correct answers, while its sealed "
                        f"correct rate moved {cross.correct_delta:+.4f} on train and the dev lower bound is "
                        f"{dev_ci_low:+.4f}",
                evidence=ids))
    return out
