"""Built-in analyzers of multi-turn SWE evidence (the swe domain). They read the columns the swe domain's sealed
scorer adds to each episode (`turns`, `tool_errors`, `actions`, `edits`, `submitted`, `end`, `tested_after_edit`,
`leak_calls`, ...; see trainer/domains/swe.py); on evidence without those columns they report nothing.

What a resolve rate hides here: how the policy works. Episodes abandoned after one turn, a policy that reads but
never edits or edits code it has not looked at, fixes submitted without running the tests, turns wasted on
malformed actions or on the same action over and over, episodes that run out of context or turns, and success
that depends on a tool the sealed evaluation does not offer (a leak).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from evotrainer.trainer.diagnostics import Finding, analyzer
from evotrainer.trainer.diagnostics.builtin import _ids, _level
from evotrainer.trainer.diagnostics.code import _has
from evotrainer.trainer.swe_env import SEALED_TOOLS

LOOKS = ("search", "view", "test")  # actions that show the policy something about the code before it edits


def _episodes(r: pd.DataFrame) -> pd.DataFrame | None:
    """The SWE episodes of a slice of evidence (rows that carry the swe columns), or None when there are none."""
    if not _has(r, "turns", "tool_errors", "actions", "edits", "submitted", "end", "tested_after_edit",
                "leak_calls"):
        return None
    e = r[r["turns"].notna()]
    return e.assign(submitted=e["submitted"].astype(bool), tested_after_edit=e["tested_after_edit"].astype(bool))


def _actions(e: pd.DataFrame) -> pd.DataFrame:
    """One row per action of every episode: `ep` (the episode's position in e), `pos` (its turn), tool, arg, error."""
    acts = [json.loads(a) if isinstance(a, str) and a else [] for a in e["actions"]]
    a = pd.DataFrame([x[:3] for ep in acts for x in ep], columns=["tool", "arg", "error"])
    a["ep"] = np.repeat(np.arange(len(acts)), [len(ep) for ep in acts])
    a["pos"] = a.groupby("ep").cumcount()
    a["arg"] = a["arg"].fillna("").astype(str)
    a["error"] = a["error"].astype(bool)
    return a


def _shares(counts: pd.Series) -> str:
    return ", ".join(f"{k} {v:.0%}" for k, v in (counts / max(counts.sum(), 1)).items()) or "none"


@analyzer("episode_turns", warning=0.20, critical=0.40, short=1)
def episode_turns(r: pd.DataFrame, s: pd.DataFrame, t: dict) -> list[Finding]:
    """Turns per episode: the mean (info), and abandonment, the share of episodes that end within `short` turns
    (submitted at once, or never got an action out). Such episodes never use the tools, so they carry no signal
    about fixing code: warm the policy up on scripted solution episodes, and check that nothing pays an early
    submit."""
    e = _episodes(r)
    if e is None or e.empty:
        return []
    turns = e["turns"].astype(float)
    mean = float(turns.mean())
    out = [Finding(analyzer="episode_turns", metric="mean_turns", value=mean, severity="info",
                   message=f"episodes take {mean:.1f} turns on average (median {turns.median():.0f}, max "
                           f"{turns.max():.0f}); the longest are cited",
                   evidence=_ids(e.sort_values("turns", ascending=False, kind="stable")))]
    short = turns <= t["short"]
    frac = float(short.mean())
    sev, thr = _level(frac, t["warning"], t["critical"])
    if sev:
        out.append(Finding(analyzer="episode_turns", metric="short_episode_ratio", value=frac, threshold=thr,
                           severity=sev,
                           message=f"{frac:.0%} of episodes end after at most {int(t['short'])} turns (how they end: "
                                   f"{_shares(e.loc[short, 'end'].value_counts())}): the policy abandons the task "
                                   "before using the tools; warm it up on scripted episodes (SFT) and make sure no "
                                   "reward pays an immediate submit",
                           evidence=_ids(e[short])))
    return out


@analyzer("edit_ratio", warning=0.50, critical=0.80, ratio=0.15)
def edit_ratio(r: pd.DataFrame, s: pd.DataFrame, t: dict) -> list[Finding]:
    """Timidity: the share of episodes that apply no edit (warning/critical above the thresholds), and applied
    edits per turn over the batch (warning below `ratio`). An episode without an applied edit cannot resolve the
    issue; a policy that only reads needs episodes that edit (SFT) or a reward for an applied, tested edit."""
    e = _episodes(r)
    if e is None or e.empty:
        return []
    edits, turns = e["edits"].astype(float), e["turns"].astype(float)
    none = (edits == 0).to_numpy()
    frac = float(none.mean())
    ratio = float(edits.sum() / max(turns.sum(), 1.0))
    out = []
    sev, thr = _level(frac, t["warning"], t["critical"])
    if sev:
        out.append(Finding(analyzer="edit_ratio", metric="no_edit_ratio", value=frac, threshold=thr, severity=sev,
                           message=f"{frac:.0%} of episodes apply no edit (edits per turn {ratio:.2f}): the policy "
                                   "looks but never changes the code, or every edit it tries fails; without an "
                                   "edit no episode can resolve the issue, so add scripted episodes that edit (SFT) "
                                   "or reward an applied edit that passes the tests",
                           evidence=_ids(e[none])))
    sev, thr = _level(ratio, t["ratio"], above=False)
    if sev:
        low = (edits / turns.clip(lower=1) < t["ratio"]).to_numpy()
        out.append(Finding(analyzer="edit_ratio", metric="edits_per_turn", value=ratio, threshold=thr, severity=sev,
                           message=f"only {ratio:.0%} of actions are applied edits ({edits.mean():.2f} per episode "
                                   f"of {turns.mean():.1f} turns): episodes spend their turns reading, not fixing",
                           evidence=_ids(e[low])))
    return out


@analyzer("search_before_edit", warning=0.30, critical=0.60)
def search_before_edit(r: pd.DataFrame, s: pd.DataFrame, t: dict) -> list[Finding]:
    """Blind edits: of the episodes with an applied edit, the share whose first applied edit came before any
    search, view or test that worked (one without an error observation). The policy guesses at code it has not
    seen; it works on the easy level where the issue names the buggy function and fails where it must be found.
    Scripted episodes that locate the bug first, or a reward that needs the edited function viewed, act on it."""
    e = _episodes(r)
    if e is None or e.empty:
        return []
    a = _actions(e)
    ok = ~a["error"]
    first_edit = a[ok & (a["tool"] == "edit")].groupby("ep")["pos"].min()
    if first_edit.empty:
        return []
    first_look = a[ok & a["tool"].isin(LOOKS)].groupby("ep")["pos"].min().astype(float).reindex(first_edit.index,
                                                                                         fill_value=np.inf)
    blind = first_edit < first_look
    frac = float(blind.mean())
    sev, thr = _level(frac, t["warning"], t["critical"])
    if not sev:
        return []
    return [Finding(analyzer="search_before_edit", metric="blind_edit_ratio", value=frac, threshold=thr,
                    severity=sev,
                    message=f"{frac:.0%} of episodes that edit make their first edit before any search, view or "
                            f"test ({int(blind.sum())} of {len(blind)}): blind edits guess at unseen code; add "
                            "scripted episodes that locate the bug before editing, or reward viewing the edited "
                            "function first",
                    evidence=_ids(e.iloc[blind.index[blind.to_numpy()]]))]


@analyzer("untested_edits", warning=0.30, critical=0.60)
def untested_edits(r: pd.DataFrame, s: pd.DataFrame, t: dict) -> list[Finding]:
    """Of the episodes with an applied edit, the share in which no test ran after the last edit: the policy never
    checks its fix, so a wrong edit is submitted (or left) as it is. Episodes that end edit, test, submit (SFT), or
    a reward that pays a passing test after the last edit, act on it."""
    e = _episodes(r)
    if e is None or e.empty:
        return []
    edited = (e["edits"] > 0).to_numpy()
    if not edited.any():
        return []
    untested = edited & ~e["tested_after_edit"].to_numpy()
    frac = float(untested.sum() / edited.sum())
    sev, thr = _level(frac, t["warning"], t["critical"])
    if not sev:
        return []
    resolved = float(e.loc[untested, "correct"].astype(bool).mean())
    return [Finding(analyzer="untested_edits", metric="untested_edit_ratio", value=frac, threshold=thr,
                    severity=sev,
                    message=f"{frac:.0%} of episodes that edit never run the tests after their last edit "
                            f"({int(untested.sum())} of {int(edited.sum())}; {resolved:.0%} of those resolve): "
                            "the policy does not check its fix; teach edit, test, submit (SFT) or pay a passing "
                            "test after the last edit",
                    evidence=_ids(e[untested]))]


@analyzer("tool_errors", warning=0.15, critical=0.30)
def tool_errors(r: pd.DataFrame, s: pd.DataFrame, t: dict) -> list[Finding]:
    """Tool error rate: actions whose observation was an error (a malformed action, shown as tool `?`, an unknown
    or disabled tool, a bad argument, an edit that does not parse) over all actions, with the errors broken down by
    tool. Each is a wasted turn; above 15% the edits are poor (DESIGN). More SFT on the action format, or a small
    penalty per error, act on it."""
    e = _episodes(r)
    if e is None or e.empty:
        return []
    errors = e["tool_errors"].astype(float)
    rate = float(errors.sum() / max(e["turns"].astype(float).sum(), 1.0))
    sev, thr = _level(rate, t["warning"], t["critical"])
    if not sev:
        return []
    a = _actions(e)
    by_tool = a.loc[a["error"], "tool"].value_counts()
    return [Finding(analyzer="tool_errors", metric="tool_error_rate", value=rate, threshold=thr, severity=sev,
                    message=f"{rate:.0%} of actions return an error (share of errors by tool: {_shares(by_tool)}; "
                            "`?` is an action that does not parse): turns wasted on malformed actions, wrong "
                            "arguments or edits that do not parse; more SFT on the action format, or a small "
                            "penalty per error action",
                    evidence=_ids(e[errors > 0].sort_values("tool_errors", ascending=False, kind="stable")))]


@analyzer("echo_loops", warning=0.05, critical=0.20, repeat=3)
def echo_loops(r: pd.DataFrame, s: pd.DataFrame, t: dict) -> list[Finding]:
    """Loops: the share of episodes that repeat the same action (same tool, same argument) `repeat` times in a
    row. The observation does not change, so the turns are wasted and the episode usually runs out of budget:
    sampling temperature, or scripted episodes that move on after an observation, act on it."""
    e = _episodes(r)
    if e is None or e.empty:
        return []
    a = _actions(e)
    if a.empty:
        return []
    prev = a.shift()
    same = (a["ep"] == prev["ep"]) & (a["tool"] == prev["tool"]) & (a["arg"] == prev["arg"])
    run = (~same).cumsum()
    length = a.groupby(run)["pos"].transform("size")
    looping = a[length >= t["repeat"]]
    looped = np.zeros(len(e), dtype=bool)
    looped[looping["ep"].unique()] = True
    frac = float(looped.mean())
    sev, thr = _level(frac, t["warning"], t["critical"])
    if not sev:
        return []
    tools = looping.drop_duplicates("ep")["tool"].value_counts()
    return [Finding(analyzer="echo_loops", metric="echo_loop_ratio", value=frac, threshold=thr, severity=sev,
                    message=f"{frac:.0%} of episodes repeat one action {int(t['repeat'])}+ times in a row (looping "
                            f"tool: {_shares(tools)}): the policy is stuck, the same observation comes back and the "
                            "turns are lost; raise the sampling temperature or add scripted episodes that move on",
                    evidence=_ids(e[looped]))]


@analyzer("premature_submit", warning=0.20, critical=0.40)
def premature_submit(r: pd.DataFrame, s: pd.DataFrame, t: dict) -> list[Finding]:
    """Of the submitted episodes, the share that submitted with no applied edit, or with an edit no test followed:
    a submit the policy had no evidence for. Such episodes resolve only by luck; a reward for submitting that needs
    a passing test after the last edit, or scripted edit, test, submit episodes, act on it."""
    e = _episodes(r)
    if e is None or e.empty:
        return []
    sub = e["submitted"].to_numpy()
    if not sub.any():
        return []
    no_edit = sub & (e["edits"] == 0).to_numpy()
    untested = sub & ~no_edit & ~e["tested_after_edit"].to_numpy()
    early = no_edit | untested
    frac = float(early.sum() / sub.sum())
    sev, thr = _level(frac, t["warning"], t["critical"])
    if not sev:
        return []
    n = sub.sum()
    out = [Finding(analyzer="premature_submit", metric="premature_submit_ratio", value=frac, threshold=thr,
                   severity=sev,
                   message=f"{frac:.0%} of submitted episodes submit without a tested edit ({no_edit.sum() / n:.0%} "
                           f"with no edit at all, {untested.sum() / n:.0%} with an edit "
                           "never tested): the policy submits without evidence that it fixed anything; pay the "
                           "submit only after a passing test, or add scripted edit, test, submit episodes",
                   evidence=_ids(e[early]))]
    # what pays for it: a reward component that gives an untested submit at least what it gives a tested one rewards
    # submitting, not fixing (a component that needs passing tests gives an untested submit less)
    tested = sub & ~early
    for col in [c for c in e.columns if c.startswith("reward_")]:
        vals = pd.to_numeric(e[col], errors="coerce").to_numpy(dtype=float)
        on_early = float(np.nanmean(vals[early])) if np.isfinite(vals[early]).any() else 0.0
        on_tested = float(np.nanmean(vals[tested])) if tested.any() and np.isfinite(vals[tested]).any() else 0.0
        if on_early > 0 and on_early >= on_tested:
            name = col.removeprefix("reward_")
            out.append(Finding(analyzer="premature_submit", metric=f"{col}_pays_premature_submit", value=on_early,
                               threshold=on_tested, severity=sev,
                               message=f"reward component {name} pays an untested submit {on_early:.2f} on average, "
                                       f"a tested one {on_tested:.2f}: it rewards submitting, not fixing; remove it, "
                                       "or pay it only after a passing test",
                               evidence=_ids(e[early])))
    return out


@analyzer("context_overflow", warning=0.05, critical=0.15)
def context_overflow(r: pd.DataFrame, s: pd.DataFrame, t: dict) -> list[Finding]:
    """How episodes end without a submit, as two shares with the same thresholds: the context window overflowed
    (long observations or many turns filled it: raise the context, shorten observations, lower the turn budget) and
    the turn budget ran out (the policy never decides it is done: scripted episodes that end with submit, or more
    turns). Neither episode is graded as resolved."""
    e = _episodes(r)
    if e is None or e.empty:
        return []
    out = []
    for end, metric, what in (
            ("context", "context_overflow_ratio",
             "overflow the context window before submitting: long search/view observations or many turns fill it; "
             "raise the context length, shorten the observations or lower the turn budget"),
            ("turn_limit", "turn_limit_ratio",
             "spend the whole turn budget without submitting: the policy never decides it is done; add scripted "
             "episodes that end with submit, or allow more turns")):
        hit = (e["end"] == end).to_numpy()
        frac = float(hit.mean())
        sev, thr = _level(frac, t["warning"], t["critical"])
        if sev:
            out.append(Finding(analyzer="context_overflow", metric=metric, value=frac, threshold=thr, severity=sev,
                               message=f"{frac:.0%} of episodes {what} (mean {e.loc[hit, 'turns'].mean():.1f} turns)",
                               evidence=_ids(e[hit])))
    return out


@analyzer("leak_usage", warning=0.01, critical=0.10, gate=0.05)
def leak_usage(r: pd.DataFrame, s: pd.DataFrame, t: dict) -> list[Finding]:
    """Leaks: episodes that called a tool the sealed evaluation does not have (`history`, which shows the commit
    that introduced the bug, so the fix can be copied), and the share of resolved episodes that used one. A gate:
    success that depends on such a tool is invalid, it vanishes under sealed evaluation. Gate when the resolved
    share exceeds `gate` or usage exceeds `critical`; fix: remove the tool from the harness's env.py (TOOLS)."""
    e = _episodes(r)
    if e is None or e.empty:
        return []
    leaked = (e["leak_calls"].astype(float) > 0).to_numpy()
    usage = float(leaked.mean())
    correct = e["correct"].astype(bool).to_numpy()
    resolved = float((leaked & correct).sum() / correct.sum()) if correct.any() else 0.0
    a = _actions(e)
    tools = ", ".join(sorted(set(a.loc[~a["error"] & ~a["tool"].isin((*SEALED_TOOLS, "?")), "tool"])))
    fix = "remove the tool from the harness's env.py (TOOLS) so training matches sealed evaluation"
    out = []
    sev, thr = _level(usage, t["warning"], t["critical"])
    if sev:
        out.append(Finding(analyzer="leak_usage", metric="leak_usage_ratio", value=usage, threshold=thr,
                           severity=sev, gate=sev == "critical",
                           message=f"{usage:.1%} of episodes call a tool the sealed evaluation does not have "
                                   f"({tools or 'leak'}; {resolved:.0%} of resolved episodes used one): what the "
                                   f"policy learns with it does not transfer; {fix}",
                           evidence=_ids(e[leaked])))
    if resolved > t["gate"]:
        out.append(Finding(analyzer="leak_usage", metric="resolved_with_leak_ratio", value=resolved,
                           threshold=t["gate"], severity="critical", gate=True,
                           message=f"{resolved:.0%} of resolved episodes used a tool the sealed evaluation does not "
                                   f"have ({tools or 'leak'}): that success is invalid, it vanishes under sealed "
                                   f"evaluation; {fix}",
                           evidence=_ids(e[leaked & correct])))
    return out
