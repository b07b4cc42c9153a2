"""The promotion rule (DESIGN §7) and the Critic's verdicts.

`judge` applies the rule to one candidate's backtest: every gate passes, the targeted metric moved as
hypothesised, and the posterior of the paired dev effect (the short run's estimate combined with a prior: what
skill memory measured of the same change, `memory/prior.py`) gives a gain a probability of at least `level`
with its 2.5% quantile above `-margin`. Three outcomes: promote; reject (a failed gate, or measured harmful: a
gain has posterior probability at most 1 - level); inconclusive (neither: the evidence is kept and memory records
it as inconclusive, not as a negative lesson). A gate
binds the champion too, validity first: when the control arms (the champion harness) fail a gate that the candidate
repairs (`repairs_of`: the main line fails it too, and the candidate passes every gate with none of the failed
metrics left at warning or critical severity: a fault below the gate's level is a reprieve, not a repair; and it
trained), the champion's dev score is not one to beat, and the burden of proof is on damage: the repair is promoted
unless its paired interval shows it worse, by more than `repair_margin`, than both the champion's arm and the policy
both arms started from (a leak can raise the control's score while it lasts, and the longer a line leans on it the
more closing it costs in a short window: judged on point estimates, a repair costing nothing would be refused half
the time).
A defect that is not a gate is weighed much the same way when it is plainly there: when the main line shows it at
critical severity and the control arms show it too, a candidate whose evidence no longer shows it, without
trading it for another, changing what the analyzers read, or learning too little to show anything (`fixes_of`),
is promoted unless measured harmful against the champion's arm (its interval below `-fix_margin`, or P(gain) at
most 1 - level; the champion's score is valid here, so that arm alone is the baseline). A diagnosed defect's fix
rarely pays measurably within one 20-step window (a completion limit that cuts a third of the programs, a learning
rate ten times too small on a noisy task): judged on a gain, the loop diagnosed such defects on every seed and left
half of them in place (docs/results/repair/README.md).
It is the only way to a `promote` decision: an LLM Critic explains and may reject or ask for revision,
but `merge_llm_verdict` never lets it promote what the rule refuses. `choose` keeps at most
`max_promotions` winners per generation (the most probable gains): single-factor changes compose across
generations, not inside one.

Gates come first and veto in every mode (short runs, replay only, repair): among them the reward-hacking gates of
`trainer/reward_gates.py`, so a reward term that pays what the sealed grade cannot see is rejected by rule, whatever
the dev interval says. A gate is inherited from the champion metric by metric (`analyzer/metric`): the champion's
format reward rising does not hide the rise of a candidate's new term.

A candidate whose train reward, scored under one reward (the candidate's, on both arms' rollouts), rose beyond
its train correct rate while dev did not, with no gate fired, is sent to diagnostics revision (`revise`):
something in training paid off that the sealed grade does not confirm, and no analyzer said so. A constant bonus
raises the reward of both arms alike and asks for nothing; nor does a change that leaves every reward term as the
champion's (a lower temperature raises the train reward of the code template's visible-test credit more than the
hidden pass rate: that gap is the champion reward's, not the change's).
"""

from __future__ import annotations

import math

from pydantic import BaseModel

from evotrainer.agents.schemas import Intervention, Verdict
from evotrainer.base.config import PromotionRule
from evotrainer.memory.prior import Prior
from evotrainer.memory.skill import Z95
from evotrainer.trainer.backtest import BacktestResult


def moved_as_hypothesised(intervention: Intervention, backtest: BacktestResult) -> bool | None:
    """Whether the metric the hypothesis names moved its way; None when the backtest does not measure it."""
    s, r = backtest.short_run, backtest.replay
    e = intervention.expected
    sign = 1 if e.direction == "up" else -1
    measured = {
        "dev_accuracy": s.delta if s else None,
        "train_correct": s.train_correct_delta if s else None,
        "train_reward": s.train_reward_delta if s else None,
        "dead_group_ratio": (r.dead_ratio_after - r.dead_ratio_before) if r else None,
    }.get(e.metric)
    return None if measured is None else sign * measured > 0


class Posterior(BaseModel):
    mean: float
    sd: float
    p_gain: float  # P(effect > 0)
    low: float  # the 2.5% quantile


def posterior(delta: float, se: float, prior: Prior) -> Posterior:
    """The normal posterior of the dev effect: prior N(mean, sd^2) times the short run's N(delta, se^2)."""
    se = max(se, 1e-9)
    precision = 1 / prior.sd ** 2 + 1 / se ** 2
    mean = (prior.mean / prior.sd ** 2 + delta / se ** 2) / precision
    sd = math.sqrt(1 / precision)
    return Posterior(mean=mean, sd=sd, p_gain=0.5 * (1 + math.erf(mean / (sd * math.sqrt(2)))), low=mean - Z95 * sd)


def repairs_of(s, failed_gates: list[str], champion_gates: set[str] | None) -> tuple[list[str], str]:
    """The gates the candidate repairs, and why one it passed is not repaired ('' when none is). A repair: the
    control arms fail the gate on their own evidence, and so does the main line (`champion_gates`, `analyzer/metric`
    keys of the generation's diagnosis; None: not known), so the champion's failure is not one short run's chance;
    the candidate passes every gate and shows none of the failed metrics at warning or critical severity (below the
    gate's level the fault is reprieved, not repaired); and it trained: a candidate arm in which no group's rewards
    differ gave GRPO no advantage anywhere, so its gate went quiet because nothing was learned (a harness that
    removes the tools the policy acts with), not because it was fixed."""
    passed = sorted(set(s.control_gates) - set(failed_gates))
    if champion_gates is not None:
        passed = [g for g in passed if any(k.split("/", 1)[0] == g for k in champion_gates)]
    frozen = _frozen(s)
    if passed and frozen:
        return [], (f"it passes gate {', '.join(passed)} that the champion fails, but no training group of seed "
                    f"{', '.join(frozen)} had a reward spread, so it learned nothing: not a repair")
    keys = set(s.control_gate_keys)  # per metric; results recorded before they were kept: per analyzer
    shown = {f"{f.analyzer}/{f.metric}" if keys else f.analyzer for f in s.findings if f.severity != "info"}
    still = [g for g in passed if ({k for k in keys if k.split("/", 1)[0] == g} or {g}) & shown]
    why = (f"it passes gate {', '.join(still)} that the champion fails, but its evidence still shows the fault below "
           "the gate's level: not a repair") if still else ""
    return [g for g in passed if g not in still], why


def _frozen(s) -> list[str]:
    """The seeds of candidate arms in which no group's rewards differed: GRPO had no advantage anywhere, so a
    finding that went quiet there went quiet because nothing was learned (a harness that removes the tools the policy
    acts with), not because it was fixed."""
    return sorted(str(a.seed) for a in s.arms if a.role == "candidate" and a.live_groups == 0)


def _reward_changed(s) -> bool:
    """Whether the candidate changed a reward term (new, changed or removed under one reward; unknown: assumed)."""
    return s.cross is None or any(t.status in ("new", "changed", "removed") for t in s.cross.terms)


def fixes_of(s, champion_defects: set[str] | None) -> tuple[list[str], str]:
    """The defects (`analyzer/metric`, not gates) the candidate fixes, and why one it silenced is not fixed ('' when
    none is). A fix, each condition a way to silence an analyzer without fixing anything closed:
    - the main line shows the metric at critical severity (`champion_defects`, from the generation's diagnosis;
      None: not known) and this comparison's control arms show it at warning or critical (`control_defects`), while
      they fail no gate (the champion's score is the one to beat);
    - the candidate's evidence (its arms pooled) shows nothing of the metric's analyzer, on any metric (a key that
      names a reward component changes with the component's name);
    - it brings no defect the control does not show, or shows worse (one defect traded for another: an update
      too small traded for groups gone dead);
    - its evidence is of the control's kind: it changed none of the rewards, prompt filters or own analyzers the
      analyzers read (`ShortRunResult.shapers`: a tie-break term makes every group look alive, dropping the long
      prompts shortens completions without a longer limit, a rewritten analyzer says anything);
    - it trained: each candidate arm kept at least half the live groups (groups with a reward spread) of the
      control arm of its seed, so its analyzers did not go quiet for lack of evidence (an update-size analyzer
      with no live step, a pay analyzer with too few right answers)."""
    from evotrainer.trainer.backtest.replay import SEVERITY, defects

    if not champion_defects or s.control_gates:
        return [], ""
    mine = defects(s.findings)
    quiet = {f.analyzer for f in s.findings if f.severity != "info"}
    fixed = [k for k in sorted(champion_defects) if k in s.control_defects and k.split("/", 1)[0] not in quiet]
    if not fixed:
        return [], ""
    what = f"its evidence no longer shows {', '.join(fixed)}"
    worse = sorted(k for k, sev in mine.items() if SEVERITY[sev] > SEVERITY[s.control_defects.get(k, "info")])
    if worse:
        return [], f"{what}, but shows {', '.join(worse)} worse than the control: not a fix"
    shapers = sorted(set(s.shapers) | ({"rewards"} if _reward_changed(s) else set()))
    if shapers:
        return [], (f"{what}, but it changed the {' and '.join(shapers)} the analyzers read: not a fix, judged as "
                    "any change")
    live = {a.seed: a.live_groups for a in s.arms if a.role == "control"}
    starved = sorted(str(a.seed) for a in s.arms if a.role == "candidate" and a.live_groups is not None and
                     (a.live_groups == 0 or a.live_groups < 0.5 * (live.get(a.seed) or 0.0)))
    if starved:
        return [], (f"{what}, but seed {', '.join(starved)} kept less than half the control's groups with a reward "
                    "spread, so it learned too little to show it: not a fix")
    return fixed, ""


def judge(intervention: Intervention, backtest: BacktestResult | None, rule: PromotionRule,
          error: str = "", prior: Prior | None = None, champion_gates: set[str] | None = None,
          champion_defects: set[str] | None = None) -> Verdict:
    """The rule's verdict on one candidate (the Critic's starting point, and its ceiling). `prior`: what memory
    measured of the same change (`memory.prior.prior_for`); None: N(0, rule.prior_sd^2). `champion_gates`: the gates
    (`analyzer/metric`) the main line's own evidence fails this generation; a repair must repair one of them.
    `champion_defects`: the other metrics it shows at critical severity (`replay.critical_defects`); a fix must fix
    one of them."""
    branch = backtest.branch if backtest else ""
    if backtest is None:
        return Verdict(branch=branch, decision="reject", reasons=[error or "no backtest result"])
    s = backtest.short_run
    base = dict(branch=backtest.branch, failed_gates=backtest.failed_gates, effect=s.delta if s else None,
                ci_low=s.ci_low if s else None, ci_high=s.ci_high if s else None)
    if backtest.failed_gates:
        # a gate the champion's own arms fail as well is inherited: the candidate cannot be promoted (it keeps the
        # fault), but the fault says nothing about its change, so memory records no lesson about the change
        inherited = inherited_gates(backtest)
        return Verdict(decision="reject", inherited_gates=inherited, reasons=[
            f"failed gate {g}" + (", which the champion fails too (inherited, not this change's doing)"
                                  if g in inherited else "") for g in backtest.failed_gates], **base)
    if s is None:
        moved = moved_as_hypothesised(intervention, backtest) if rule.replay_only else None
        if moved:
            e = intervention.expected
            return Verdict(decision="promote", reasons=[f"replay only (ablation): {e.metric} moved {e.direction} as "
                                                        "hypothesised, all gates pass; no sealed dev evidence"], **base)
        return Verdict(decision="reject", reasons=["replay only: no short-run evidence on sealed dev" +
                                                   (f" and the replay does not show {intervention.expected.metric} "
                                                    f"moving {intervention.expected.direction}" if rule.replay_only
                                                    else "")], **base)
    if not s.estimable:  # a prior alone must never promote, and one seed with no seed spread measured nothing
        return Verdict(decision="inconclusive", reasons=[
            f"dev {s.delta:+.3f} over one seed x {s.steps} steps with no training-seed spread configured: no "
            "interval is estimable, nothing was measured (run with --seeds 2, or set backtest.seed_sd)"], **base)
    prior = prior or Prior.vague(rule.prior_sd)
    post = posterior(s.delta, s.se, prior)
    interval = (f"dev {s.delta:+.3f} [{s.ci_low:+.3f}, {s.ci_high:+.3f}] over {len(s.seeds)} seeds x {s.steps} steps "
                f"(MDE {s.mde:.3f}); P(gain) {post.p_gain:.2f}, posterior {post.mean:+.3f} +- {post.sd:.3f} (prior: "
                f"{prior.source})")
    repaired, not_repaired = repairs_of(s, backtest.failed_gates, champion_gates)
    fixed, not_fixed = fixes_of(s, champion_defects) if rule.fix_margin is not None else ([], "")
    base |= dict(repairs=repaired, fixes=fixed, mde=s.mde, p_gain=post.p_gain, posterior=(post.mean, post.sd),
                 prior=prior.source)
    floor = rule.min_ci_low is None or s.ci_low > rule.min_ci_low
    if post.p_gain >= rule.level and post.low > -rule.margin and floor:
        moved = moved_as_hypothesised(intervention, backtest)
        if moved is not False:
            return Verdict(decision="promote", reasons=[
                f"{interval}: a gain with probability at least {rule.level:g}, no loss beyond {rule.margin:g} (2.5% "
                "quantile), all gates pass"], **base)
        if not (repaired or fixed):  # a repair's mechanism is the gate it passes, a fix's the defect it removes
            return Verdict(decision="reject", reasons=[f"{interval}, but {intervention.expected.metric} did not move "
                                                       f"{intervention.expected.direction} as hypothesised"], **base)
    # under one reward: each arm's own harness would count a new term's level (or a constant bonus) as a rise
    reward_rise = s.cross.reward_delta if s.cross else s.train_reward_delta
    unexplained = reward_rise - s.train_correct_delta  # a curriculum raises both: that is not a hack
    # a change that leaves every reward term as the champion's (a temperature, a learning rate) pays for nothing
    # new: a gap between that reward and `correct` is the champion's, diagnosed on the main line
    reward_changed = _reward_changed(s)
    if unexplained > rule.revise_reward_rise and s.delta <= 0 and reward_changed:  # before a repair: validity
        return Verdict(decision="revise", reasons=[
            f"train reward (the candidate's, on both arms) rose {reward_rise:+.3f} over the control "
            f"({unexplained:+.3f} more than the sealed train correct rate) but {interval} and no gate fired: a "
            "diagnostic missed what the reward paid for"], **base)
    if repaired:
        # the champion fails these gates on its own evidence, so its dev score is not one to beat: the candidate that
        # passes every gate replaces it unless it is shown worse than the champion's arm and than where both started
        fixed = f"repairs gate {', '.join(repaired)} that the champion fails; {interval}"
        m = rule.repair_margin
        if s.ci_high >= -m:
            return Verdict(decision="promote", reasons=[
                f"{fixed}: not shown worse than the champion's arm (upper bound {s.ci_high:+.3f} >= "
                f"{0.0 - m:+.3f}), all gates pass"], **base)
        if s.start_delta is not None and s.start_ci_high >= -m:
            return Verdict(decision="promote", reasons=[
                f"{fixed}; vs the starting policy ({s.start_dev:.3f}) {s.start_delta:+.3f} [{s.start_ci_low:+.3f}, "
                f"{s.start_ci_high:+.3f}]: not shown to lose ground from where both arms started, all gates pass"],
                **base)
    if fixed and not repaired and s.ci_high >= -rule.fix_margin and post.p_gain > 1 - rule.level:
        # the defect is plain on the main line and in this comparison's control arms, and gone from the candidate's
        # evidence: its fix replaces the champion unless measured harmful (the champion's score is valid: no gate
        # fails), by the rule's own measure of harm (P(gain) at most 1 - level) or by its interval
        return Verdict(decision="promote", reasons=[
            f"fixes {', '.join(fixed)}, critical on the main line and shown by the champion's arms, silent in the "
            f"candidate's; {interval}: not measured harmful (upper bound {s.ci_high:+.3f} >= "
            f"{0.0 - rule.fix_margin:+.3f}, P(gain) {post.p_gain:.2f} > {1 - rule.level:.2f}), all gates pass"], **base)
    harmful = s.ci_high < 0 or post.p_gain <= 1 - rule.level
    why = ("measured harmful: worse than the champion" if s.ci_high < 0 else
           f"measured harmful: a gain has probability {post.p_gain:.2f}" if harmful else
           f"inconclusive: neither a gain (probability {post.p_gain:.2f} < {rule.level:g}"
           + (f", or a loss beyond {rule.margin:g} not excluded" if post.low <= -rule.margin else "")
           + ") nor a loss is shown")
    if repaired and s.start_delta is not None:
        why += (f", and shown worse than the starting policy ({s.start_dev:.3f}) too, {s.start_delta:+.3f} "
                f"[{s.start_ci_low:+.3f}, {s.start_ci_high:+.3f}], though it repairs {', '.join(repaired)}")
    if fixed:
        why += f", though it fixes {', '.join(fixed)}"
    for note in (not_repaired, not_fixed):
        if note:
            why += f"; {note}"
    return Verdict(decision="reject" if harmful else "inconclusive",
                   reasons=[f"{interval}: {why} (stopped: {s.stopped})"], **base)


def inherited_gates(backtest: BacktestResult) -> list[str]:
    """The failed gates the champion's own short-run arms fail too, on every metric the candidate fails them on
    (a gate the replay attributes to the candidate's change is never inherited)."""
    s = backtest.short_run
    if s is None:
        return []
    own: dict[str, set[str]] = {}
    for f in s.findings:
        if f.gate:
            own.setdefault(f.analyzer, set()).add(f"{f.analyzer}/{f.metric}")
    control = set(s.control_gate_keys)
    replayed = set(backtest.replay.failed_gates) if backtest.replay else set()
    return sorted(g for g in backtest.failed_gates if g not in replayed and
                  (own[g] <= control if g in own and control else g in s.control_gates))


def choose(verdicts: list[Verdict], rule: PromotionRule) -> list[Verdict]:
    """Keep the `max_promotions` promotable verdicts with the highest posterior probability of a gain; the others
    become inconclusive, saying why (they met the rule: not negative evidence for skill memory)."""
    # a repair of the champion's failed gate first: validity before score (a fix of a plain defect is ranked by its
    # probability of a gain like any change: the champion's score is valid, and the fix may be tested again on the
    # next champion)
    ranked = sorted((v for v in verdicts if v.decision == "promote"),
                    key=lambda v: (bool(v.repairs), v.p_gain or 0.0, v.ci_low or 0.0), reverse=True)
    winners = {v.branch for v in ranked[:rule.max_promotions]}
    out = []
    for v in verdicts:
        if v.decision == "promote" and v.branch not in winners:
            best = ranked[0]
            v = v.model_copy(update={"decision": "inconclusive", "reasons": v.reasons + [
                f"{best.branch} was promoted instead (one change a generation; P(gain) {_p(best)} vs {_p(v)})"]})
        out.append(v)
    return out


def _p(v: Verdict) -> str:
    return "n/a" if v.p_gain is None else f"{v.p_gain:.2f}"


def merge_llm_verdict(rule_verdict: Verdict, llm_verdict: Verdict) -> Verdict:
    """An LLM Critic's verdict within the rule's ceiling: it may turn a promote into a reject or a revise (its
    reasons are kept), never a reject into a promote. An overruled promote keeps none of its reasons (they argue
    for the decision that was refused), only a note that it was overruled. Gates and numbers always come from the
    backtest."""
    if llm_verdict.decision == "promote" and rule_verdict.decision != "promote":
        return rule_verdict.model_copy(update={
            "reasons": rule_verdict.reasons + ["the meta-LLM Critic's promote was overruled by the promotion rule"],
            "lesson": llm_verdict.lesson})
    reasons = rule_verdict.reasons + [r for r in llm_verdict.reasons if r not in rule_verdict.reasons]
    return rule_verdict.model_copy(update={"decision": llm_verdict.decision, "reasons": reasons,
                                           "lesson": llm_verdict.lesson})
