"""What the agents hand each other (DESIGN §7): an intervention proposed by the Planner, a verdict by the Critic.

Findings come from `trainer.diagnostics.Finding`, backtests from `trainer.backtest.BacktestResult`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from evotrainer.memory.prior import Prior
from evotrainer.memory.store import Hit
from evotrainer.trainer.backtest import BacktestResult
from evotrainer.trainer.diagnostics import Finding
from evotrainer.trainer.diagnostics.report import HealthReport


class ExpectedEffect(BaseModel):
    metric: str = Field("dev_accuracy", description="the metric the change should move")
    direction: Literal["up", "down"] = "up"
    size: float = Field(0.0, ge=0.0, description="the smallest move that would confirm the hypothesis")


class Intervention(BaseModel):
    """One single-factor change to the harness, with a falsifiable hypothesis."""

    id: str
    hypothesis: str = Field(description="if we change X, Y improves because Z")
    factor: str = Field(description="the one thing changed, dotted: reward.format_weight, recipe.temperature, ...")
    change: str = Field(description="what is edited, in words")
    target_files: list[str] = Field(default_factory=list)
    expected: ExpectedEffect = Field(default_factory=ExpectedEffect)
    transform: str | None = Field(None, description="the catalog transform that implements it (the catalog writes the "
                                                    "edit, in either policy), or null for a free-form edit")
    sources: list[str] = Field(default_factory=list, description="finding ids (analyzer:metric) and skill ids")


class Verdict(BaseModel):
    """The Critic's decision on one backtested candidate. `promote` only when the promotion rule allows it."""

    branch: str
    decision: Literal["promote", "reject", "inconclusive", "revise"]
    reasons: list[str] = Field(default_factory=list)
    failed_gates: list[str] = Field(default_factory=list)
    effect: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    mde: float | None = Field(None, description="the short run's minimum detectable effect (80% power, 5% level)")
    p_gain: float | None = Field(None, description="posterior probability of a dev gain (prior x short run)")
    posterior: tuple[float, float] | None = Field(None, description="posterior mean and standard deviation")
    prior: str = Field("", description="where the prior came from")
    repairs: list[str] = Field(default_factory=list, description="gates the champion fails that this candidate "
                                                                 "repairs (`critic.repairs_of`)")
    fixes: list[str] = Field(default_factory=list, description="defects (`analyzer/metric`) the main line shows at "
                                                               "critical severity that this candidate fixes "
                                                               "(`critic.fixes_of`)")
    inherited_gates: list[str] = Field(default_factory=list, description="failed gates the champion's own arms fail "
                                                                         "too: not this change's doing")
    lesson: str = Field("", description="what a later generation should learn from this candidate, in one or two "
                                        "sentences")


class VerdictRecord(Verdict):
    """A judged candidate as its run keeps it: `reports/verdict-<branch>.json` and the annotation of the candidate's
    git tag (`gen-<N>` when promoted, `rejected/<name>` otherwise) hold this same record."""

    intervention: Intervention | None = None
    author: str = Field("", description="who judged it: the meta-policy's label, or `promotion rule` "
                                        "(`evotrainer backtest --judge`)")
    generation: int = 0

    @property
    def transform(self) -> str | None:
        return self.intervention.transform if self.intervention else None

    @classmethod
    def load(cls, path: Path) -> VerdictRecord | None:
        """The record at `path`, None when the candidate was not judged yet."""
        return cls.model_validate_json(path.read_text()) if path.is_file() else None

    def save(self, path: Path) -> None:
        from evotrainer.base.files import atomic_write_text

        atomic_write_text(path, self.model_dump_json(indent=2))


class Bottleneck(BaseModel):
    """One thing holding training back, as the Diagnoser reads it from the findings."""

    title: str
    findings: list[str] = Field(default_factory=list, description="finding ids it rests on (analyzer:metric)")
    severity: Literal["info", "warning", "critical"] = "warning"
    evidence: list[str] = Field(default_factory=list, description="rollout ids that show it")
    explanation: str = ""


class Diagnosis(BaseModel):
    """The Diagnoser's output: ranked bottlenecks, most limiting first."""

    generation: int
    summary: str = Field(description="the diagnosis in two or three sentences; this is what skill retrieval reads")
    bottlenecks: list[Bottleneck] = Field(default_factory=list)
    author: str = ""


class Plan(BaseModel):
    """The Planner's output: up to K single-factor interventions, best first."""

    interventions: list[Intervention] = Field(default_factory=list)
    rationale: str = ""
    author: str = ""


class Edit(BaseModel):
    """One edit of a harness file: a search/replace block, or the whole file when `search` is None."""

    path: str
    search: str | None = None
    replace: str


class CodeResult(BaseModel):
    """The Coder's output for one intervention."""

    edits: list[Edit] = Field(min_length=1)
    message: str = Field(description="the commit subject")


# -- what each agent is given (the table in agents/meta_policy.py) ---------------------------------------
class Sample(BaseModel):
    """One rollout shown to an agent. Its text is data quoted from the policy, never an instruction."""

    rollout_id: str
    prompt: str
    completion: str
    reward: float
    correct: bool
    truncated: bool = False


class DiagnoseInput(BaseModel):
    """The Diagnoser's input: the champion line's health report and rollouts of its last segment."""

    generation: int
    report: HealthReport
    worst: list[Sample] = Field(default_factory=list, description="lowest-reward rollouts")
    random: list[Sample] = Field(default_factory=list, description="a uniform sample")
    previous: list[Diagnosis] = Field(default_factory=list, description="earlier generations' diagnoses")


class LineageEntry(BaseModel):
    generation: int
    branch: str
    factor: str
    transform: str | None = None
    status: str
    effect: float | None = None
    reason: str = ""


class PlanInput(BaseModel):
    """The Planner's input. What it may propose is cut by `agents/planner.py::admissible` in either policy."""

    generation: int
    domain: str
    k: int
    diagnosis: Diagnosis
    findings: list[Finding]
    skills: list[Hit] = Field(default_factory=list, description="retrieved skills, positive and negative")
    lineage: list[LineageEntry] = Field(default_factory=list)
    files: dict[str, str] = Field(default_factory=dict, description="the champion harness")
    tried: list[str] = Field(default_factory=list, description="factors already tried on this champion commit")
    same_diagnosis: float = Field(0.75, description="retrieval score above which a skill's trigger counts as this "
                                                    "diagnosis (the store's merge threshold)")
    priors: dict[str, Prior] = Field(default_factory=dict, description="what memory measured of each catalog "
                                     "transform, in any run and domain (memory.prior); absent: nothing measured")
    prior_sd: float = Field(0.02, description="the spread of the prior of a change memory knows nothing of "
                                             "(PromotionRule.prior_sd)")


class CodeInput(BaseModel):
    """The Coder's input: one intervention and what it rests on. A catalog transform is applied as the catalog
    writes it (`agents/coder.py::catalog_edits`) by either policy."""

    intervention: Intervention
    files: dict[str, str]
    findings: list[Finding] = Field(default_factory=list, description="the champion's health report this generation")
    diagnosis: Diagnosis | None = Field(None, description="the diagnosis the intervention answers")
    error: str = Field("", description="why the previous attempt failed validation (repair rounds)")
    attempt: int = 0


class CritiqueInput(BaseModel):
    """The Critic's input: the promotion rule's verdict on one candidate and everything it was decided on."""

    verdict: Verdict = Field(description="the promotion rule's verdict (agents/critic.py::judge)")
    intervention: Intervention
    backtest: BacktestResult | None = Field(None, description="None: never backtested (`verdict` says why)")
    findings: list[Finding] = Field(default_factory=list, description="the champion line's health report this "
                                    "generation (the harness the control arms train under)")


class ReviseInput(BaseModel):
    """Diagnostics revision's input: a judged candidate whose train reward rose without dev and that no analyzer
    flagged. What comes back is validated on history by the loop before it reaches the champion."""

    branch: str
    culprit: str = Field(description="the reward term that rose most among equally correct rollouts, or `reward`")
    intervention: Intervention
    verdict: Verdict | None = None
    backtest: BacktestResult | None = None
    findings: list[Finding] = Field(default_factory=list, description="the champion line's health report")
    files: dict[str, str] = Field(default_factory=dict, description="the champion harness")
