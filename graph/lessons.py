"""What a judged candidate teaches: the Critic's verdict and its backtest, mapped to memory's `Lesson`.

The distill node calls `lesson_of`; memory stores and merges the result without knowing what a verdict is. A
lesson's trigger is the part of the diagnosis its candidate answered (`trigger_for`), so the candidates of one
generation leave skills that later diagnoses tell apart.
"""

from __future__ import annotations

from evotrainer.agents.schemas import Diagnosis, Intervention, Verdict
from evotrainer.memory.distill import Lesson, trigger_of
from evotrainer.memory.skill import Trigger, Validation
from evotrainer.trainer.backtest import BacktestResult
from evotrainer.trainer.diagnostics import Finding


def validation_of(verdict: Verdict, domain: str, backtest: BacktestResult | None = None, *, run: str = "",
                  generation: int = 0, commit: str = "") -> Validation:
    """The verdict as one validation of a skill: the short run's paired dev effect when there was one."""
    s = backtest.short_run if backtest else None
    gates = sorted(set(verdict.failed_gates) | set(backtest.failed_gates if backtest else []))
    return Validation(domain=domain, verdict=verdict.decision, failed_gates=gates, repairs=verdict.repairs,
                      effect=s.delta if s else verdict.effect, ci_low=s.ci_low if s else verdict.ci_low,
                      ci_high=s.ci_high if s else verdict.ci_high, seeds=len(s.seeds) if s else 0,
                      steps=s.steps if s else 0, dev_items=s.dev_items if s else 0,
                      run=run or (backtest.run if backtest else ""),
                      generation=backtest.generation if backtest else generation, branch=verdict.branch,
                      commit=commit or (backtest.commit if backtest else ""))


def lesson_text(intervention: Intervention, v: Validation) -> str:
    """The lesson in one sentence, when the Critic wrote none."""
    if v.failed_gates:
        return f"{intervention.change}: blocked by {', '.join(v.failed_gates)} in {v.domain}."
    if v.effect is None:
        return f"{intervention.change}: {v.verdict} in {v.domain}, not measured on dev."
    if v.repairs:
        return (f"{intervention.change}: repairs {', '.join(v.repairs)} that the champion failed; dev {v.effect:+.3f} "
                f"[{v.ci_low:+.3f}, {v.ci_high:+.3f}] against the gated champion over {v.seeds} seeds x {v.steps} "
                f"steps in {v.domain} ({v.verdict}).")
    return (f"{intervention.change}: dev {v.effect:+.3f} [{v.ci_low:+.3f}, {v.ci_high:+.3f}] over {v.seeds} seeds x "
            f"{v.steps} steps in {v.domain} ({v.verdict}).")


def trigger_for(intervention: Intervention, findings: list[Finding], diagnosis: Diagnosis | str = "") -> Trigger:
    """The diagnosis this candidate answered: the findings its plan cites in `sources` (`analyzer:metric`, or an
    analyzer id), their warning and critical ones when it cites any, worded as the Diagnoser worded them (the titles
    of the bottlenecks resting on them) or else by their analyzers; the analyzer ids are theirs. A candidate that
    cites no finding (an exploration) answered the whole diagnosis: its summary and every severe finding."""
    sources = set(intervention.sources)
    cited = [f for f in findings if f"{f.analyzer}:{f.metric}" in sources or f.analyzer in sources]
    summary = diagnosis.summary if isinstance(diagnosis, Diagnosis) else diagnosis
    if not cited:
        return trigger_of(list(findings), summary)
    kept = [f for f in cited if f.severity != "info"] or cited
    ids = {f"{f.analyzer}:{f.metric}" for f in kept}
    titles = [b.title.strip() for b in (diagnosis.bottlenecks if isinstance(diagnosis, Diagnosis) else [])
              if ids & set(b.findings) and b.title.strip()]
    return trigger_of(kept, "; ".join(dict.fromkeys(titles)))


def lesson_of(intervention: Intervention, verdict: Verdict, domain: str, *, findings: list[Finding] = (),
              diagnosis: Diagnosis | str = "", backtest: BacktestResult | None = None, run: str = "",
              generation: int = 0, commit: str = "") -> Lesson:
    """What memory records of one judged candidate: the diagnosis that called for it (`trigger_for`), the change,
    the evidence."""
    validation = validation_of(verdict, domain, backtest, run=run, generation=generation, commit=commit)
    e = intervention.expected
    return Lesson(trigger=trigger_for(intervention, list(findings), diagnosis), factor=intervention.factor,
                  change=intervention.change, transform=intervention.transform,
                  expected=f"{e.metric} {e.direction} by at least {e.size:g}", validation=validation,
                  text=verdict.lesson.strip() or lesson_text(intervention, validation))
