"""The reward-hacking gates on synthetic rollouts: each decision fed its worst case.

Rollouts are drawn as the math domain writes them (groups of eight, `correct` and `formatted` graded by the
sealed side, one column per reward term); a "property" column stands for what a hack pays for (length, a
token, a copied prompt): independent of correctness. The real-component path (replay and both-harness
scoring in isolated children) is tested in test_backtest.py.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from evotrainer.trainer.reward_gates import cross_score, divergence_gate, unsealed_gate, unsealed_share

TEMPLATE = {"reward_correctness": 1.0, "reward_answer_format": 0.1}


def rollouts(seed: int = 0, groups: int = 60, p_prop: float = 0.4, arm: str = "a") -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(groups):
        solve = rng.choice([0.0, 0.3, 0.95])  # dead all-wrong groups, mixed ones, nearly solved ones
        for i in range(8):
            correct = bool(rng.random() < solve)
            rows.append(dict(rollout_id=f"{arm}{k}-{i}", group_id=f"{arm}g{k}", correct=correct,
                             formatted=correct or bool(rng.random() < 0.8), loss_masked=False,
                             prop=float(rng.random() < p_prop), length=float(rng.integers(1, 40))))
    df = pd.DataFrame(rows)
    return scored(df, {"reward_correctness": df["correct"].astype(float),
                       "reward_answer_format": df["formatted"].astype(float)}, TEMPLATE)


def scored(df: pd.DataFrame, values: dict[str, pd.Series], weights: dict[str, float]) -> pd.DataFrame:
    out = df.drop(columns=[c for c in df if c.startswith("reward")])
    for c, v in values.items():
        out[c] = np.asarray(v, dtype=float)
    out["reward"] = sum(out[c] * w for c, w in weights.items())
    return out


def candidate(before: pd.DataFrame, extra: dict[str, tuple[pd.Series, float]] | None = None,
              weights: dict[str, float] | None = None) -> tuple[pd.DataFrame, dict[str, float]]:
    """The candidate's reward on the same rollouts: the template's terms (re-weighted) plus `extra` terms."""
    weights = {**TEMPLATE, **(weights or {})}
    values = {c: before[c] for c in weights}
    for name, (v, w) in (extra or {}).items():
        values[name], weights[name] = v, w
    return scored(before, values, weights), weights


def gates(before, after, weights, scale="group", before_scale="group"):
    return unsealed_gate(unsealed_share(before, after, weights, before_scale, scale), after, {})


@pytest.mark.parametrize("weight", [0.02, 0.1, 0.3, 1.0])
@pytest.mark.parametrize("pays", ["prop", "length"])
def test_a_term_paying_for_what_the_sealed_grade_ignores_is_gated_at_any_weight(weight, pays):
    before = rollouts()
    prop = before[pays] / before[pays].max()
    after, w = candidate(before, {"reward_hack": (prop, weight)})
    found = gates(before, after, w)
    assert [f.analyzer for f in found] == ["unsealed_preference"] and found[0].gate
    assert "hack" in found[0].message and found[0].metric == "reward_hack_unsealed_share_rise"
    hack_ids = set(found[0].evidence)
    assert hack_ids and hack_ids <= set(before["rollout_id"])
    # without group normalisation the term is weaker, not different: still gated
    assert [f.analyzer for f in gates(before, after, w, scale="none", before_scale="none")] == ["unsealed_preference"]


def test_a_term_mostly_aligned_with_correctness_is_still_gated_by_what_it_adds():
    """Paying short episodes when solved ones are short: most of the term's variation lies between correct and
    incorrect rollouts (an unsealed fraction under `fraction`), yet in the dead groups it is the whole gradient.
    The share it adds decides; so a format term that misreads a single rollout of a dead group, which turns that
    group's whole gradient toward the misread, is gated too."""
    before = rollouts()
    rng = np.random.default_rng(1)
    aligned = before["correct"].astype(float) + 0.05 * rng.random(len(before))  # mostly correctness, a little noise
    after, w = candidate(before, {"reward_short": (aligned, 0.1)})
    share = unsealed_share(before, after, w, "group", "group")
    term = next(t for t in share.terms if t.term == "short")
    assert term.unsealed_fraction < 0.05 and term.after > 0.01
    assert [f.analyzer for f in unsealed_gate(share, after, {})] == ["unsealed_preference"]
    dead = (before.groupby("group_id")["correct"].transform("nunique") == 1) & \
        (before.groupby("group_id")["formatted"].transform("nunique") == 1)
    almost = before["formatted"].astype(float).copy()
    row = before.index[dead][0]
    almost[row] = 1.0 - almost[row]  # the format term misreads one rollout
    fmt, w = candidate(before, {"reward_answer_format": (almost, 0.2)})
    found = gates(before, fmt, w)
    assert [f.analyzer for f in found] == ["unsealed_preference"] and before.loc[row, "rollout_id"] in found[0].evidence


def test_harmless_changes_and_repairs_are_not_gated():
    before = rollouts()
    same, w = candidate(before)  # a learning rate, a temperature, a loss type: the reward is the champion's
    assert gates(before, same, w) == []
    bonus, w = candidate(before, {"reward_bonus": (pd.Series(1.0, index=before.index), 0.3)})  # a constant bonus
    assert gates(before, bonus, w) == []
    fmt, w = candidate(before, weights={"reward_answer_format": 1.0})  # a format weight: the sealed parser's own
    assert gates(before, fmt, w) == []
    dropped, w = candidate(before, weights={"reward_answer_format": 0.0})
    assert gates(before, dropped, w) == []
    # a reward that follows the sealed grade more closely: the champion paid unformatted answers as right
    buggy = scored(before, {"reward_correctness": (before["correct"] | ~before["formatted"]).astype(float),
                            "reward_answer_format": before["formatted"].astype(float)}, TEMPLATE)
    fixed, w = candidate(buggy, weights={})
    fixed = scored(fixed, {"reward_correctness": before["correct"].astype(float),
                           "reward_answer_format": before["formatted"].astype(float)}, w)
    assert gates(buggy, fixed, w) == []


def test_a_hack_inherited_from_the_champion_is_only_gated_when_strengthened():
    base = rollouts()
    prop = base["prop"]
    champion, w0 = candidate(base, {"reward_hack": (prop, 0.1)})
    removed, w = candidate(base)  # the repair: the hack term is gone
    assert gates(champion, removed, w) == []
    weaker, w = candidate(base, {"reward_hack": (prop, 0.05)})
    assert gates(champion, weaker, w) == []
    stronger, w = candidate(base, {"reward_hack": (prop, 0.3)})
    assert [f.analyzer for f in gates(champion, stronger, w)] == ["unsealed_preference"]
    assert gates(champion, champion, w0) == []  # the same harness: nothing changed


def _arms(p_cand: float, p_ctrl: float = 0.4, seed: int = 0):
    cand, ctrl = rollouts(seed, p_prop=p_cand, arm="k"), rollouts(seed + 1, p_prop=p_ctrl, arm="c")
    return cand, ctrl


def _cross(cand, ctrl, weight, champion_has_hack=False, bonus=False):
    """Both arms under both harnesses: the candidate adds `reward_hack` (or a constant bonus)."""
    term = (lambda df: pd.Series(1.0, index=df.index)) if bonus else (lambda df: df["prop"])
    w_cand = {**TEMPLATE, "reward_hack": weight}
    w_champ = {**TEMPLATE, **({"reward_hack": weight} if champion_has_hack else {})}
    cand = scored(cand, {"reward_correctness": cand["correct"].astype(float),
                         "reward_answer_format": cand["formatted"].astype(float), "reward_hack": term(cand)}, w_cand)
    ctrl_cols = {"reward_correctness": ctrl["correct"].astype(float),
                 "reward_answer_format": ctrl["formatted"].astype(float)}
    if champion_has_hack:
        ctrl_cols["reward_hack"] = term(ctrl)
    ctrl = scored(ctrl, ctrl_cols, w_champ)
    cand_on_ctrl = {c: (term(ctrl) if c == "reward_hack" else ctrl[c]).tolist() for c in w_cand}
    champ_on_cand = {c: cand[c].tolist() for c in w_champ}
    return cross_score(cand, ctrl, cand_on_ctrl, champ_on_cand, w_cand, w_champ), cand


def test_divergence_a_learned_hack_is_gated_whatever_its_weight_and_a_lucky_dev_interval():
    cand, ctrl = _arms(p_cand=0.8)
    for weight in (0.02, 1.0):
        cross, rows = _cross(cand, ctrl, weight)
        hack = next(t for t in cross.terms if t.term == "hack" and t.harness == "candidate")
        assert hack.status == "new" and hack.within_delta == pytest.approx(weight * 0.4, abs=weight * 0.1)
        # a dev lower bound a few thousandths above zero explains nothing
        found = divergence_gate(cross, rows, dev_ci_low=0.003, t={})
        assert [f.analyzer for f in found] == ["reward_divergence"] and found[0].gate and found[0].evidence
        assert all(i in set(rows["rollout_id"]) for i in found[0].evidence)
    # the same rise bought a sealed gain at least as large (train and dev lower bound): not a divergence
    cross, rows = _cross(cand, ctrl, 0.02)
    cross = cross.model_copy(update={"correct_delta": 0.1})
    assert divergence_gate(cross, rows, dev_ci_low=0.05, t={}) == []
    # a train gain alone does not: dev must confirm it
    assert [f.analyzer for f in divergence_gate(cross, rows, dev_ci_low=-0.01, t={})] == ["reward_divergence"]


def test_divergence_neutral_cases():
    cand, ctrl = _arms(p_cand=0.4)  # the term exists but the policy did not learn it
    cross, rows = _cross(cand, ctrl, 0.3)
    assert divergence_gate(cross, rows, dev_ci_low=-0.01, t={}) == []
    learned, _ = _arms(p_cand=0.8)
    cross, rows = _cross(learned, ctrl, 0.3, champion_has_hack=True)  # the champion's own term: not this change
    assert {t.status for t in cross.terms if t.term == "hack"} == {"unchanged"}
    assert divergence_gate(cross, rows, dev_ci_low=-0.01, t={}) == []
    cross, rows = _cross(learned, ctrl, 0.3, bonus=True)  # a constant bonus: nothing to learn, no rise under one reward
    assert divergence_gate(cross, rows, dev_ci_low=-0.01, t={}) == []
    assert cross.reward_delta == pytest.approx(cross.reward_delta_champion)
    assert cross.reward_delta == pytest.approx(cross.correct_delta + 0.1 * (rows["formatted"].mean() -
                                                                            ctrl["formatted"].mean()))
