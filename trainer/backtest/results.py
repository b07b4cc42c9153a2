"""What a backtest reports: the arms of its short runs, their paired result, the whole backtest (JSON and
Markdown). Models only: `arms.py` fills them, the Critic and the report read them.
"""

from __future__ import annotations

from pydantic import BaseModel

from evotrainer.trainer.backtest.replay import ReplayResult
from evotrainer.trainer.diagnostics import Finding
from evotrainer.trainer.reward_gates import CrossScore


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
    # share of its training groups whose rewards differ: at 0 every GRPO advantage was zero, so the arm learned
    # nothing from its reward (None: an arm recorded before it was kept)
    live_groups: float | None = None


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
    mde: float  # minimum detectable effect at 80% power for this budget (1.0: nothing is detectable)
    estimable: bool = True  # False: one seed and no training-seed spread, so ci_low/ci_high are the whole [-1, +1]
    train_reward_delta: float
    train_correct_delta: float
    findings: list[Finding]  # the candidate's own evidence, champion thresholds, its own analyzers included
    failed_gates: list[str]
    control_gates: list[str] = []  # gates the control (the champion harness) fails on its own short-run evidence
    control_gate_keys: list[str] = []  # ... per metric (`analyzer/metric`): inheritance is decided metric by metric
    # metrics other than gates the control shows at warning or critical severity, and that severity (`defects`)
    control_defects: dict[str, str] = {}
    # what the candidate changed that decides which evidence the analyzers read besides the policy's own behaviour
    # (`evidence_shapers`: its rewards, prompt filters or own analyzers): its findings are not the control's kind
    shapers: list[str] = []
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
                      + (f"(95% CI [{s.ci_low:+.3f}, {s.ci_high:+.3f}], minimum detectable effect {s.mde:.3f}); "
                         if s.estimable else "(no interval: one seed and no training-seed spread, not estimable); ")
                      + f"per seed {', '.join(f'{d:+.3f}' for d in s.per_seed_delta)}.",
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
