"""The loop's state: one typed object, checkpointed by LangGraph after every node (DESIGN §1).

Heavy artefacts (health reports, evidence, transcripts) live as files in the run directory; the state holds
what routing and the next node need: the typed results nodes hand each other (a candidate's backtest and
verdict), not paths to re-parse.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, field_validator

from evotrainer.agents.schemas import Diagnosis, Intervention, Plan, Verdict
from evotrainer.trainer.backtest import BacktestResult
from evotrainer.trainer.diagnostics import Finding


class CandidateState(BaseModel):
    intervention: Intervention
    branch: str = ""
    commit: str = ""
    attempts: int = 0
    error: str = Field("", description="why it never reached a backtest (edit, validation, crash)")
    backtest: BacktestResult | None = Field(None, description="its backtest (also in reports/backtest-*.json)")
    verdict: Verdict | None = None

    @field_validator("backtest", mode="before")
    @classmethod
    def _from_path(cls, value):
        """A checkpoint written before backtests were held in the state names the report's path: read it."""
        if isinstance(value, str):
            return BacktestResult.model_validate_json(Path(value).read_text()) if value else None
        return value


class GenerationRecord(BaseModel):
    """One row of the final summary: what a generation did."""

    generation: int
    champion_commit: str
    checkpoint: str
    trained: str | None = Field(None, description="the policy this generation's train node produced (or adopted)")
    dev_trained: float | None = Field(None, description="dev accuracy of the champion after this generation's train")
    dev_accuracy: float | None = Field(None, description="dev accuracy of the champion at the generation's end")
    promoted: str | None = None
    candidates: list[str] = Field(default_factory=list)
    rejected: list[str] = Field(default_factory=list, description="branch: reason")
    revised: str | None = Field(None, description="the analyzer added by diagnostics revision, if any")


class LoopState(BaseModel):
    generation: int = 1
    checkpoint: str = Field("", description="the champion policy")
    dev_start: float | None = None
    dev_trained: float | None = None
    trained: str | None = Field(None, description="this generation's trained (or adopted) main-line segment")
    findings: list[Finding] = Field(default_factory=list)
    diagnosis: Diagnosis | None = None
    plan: Plan | None = None
    candidates: list[CandidateState] = Field(default_factory=list)
    revise: list[str] = Field(default_factory=list, description="branches whose verdict asked for a diagnostics "
                                                                "revision")
    revised: str | None = None
    history: list[GenerationRecord] = Field(default_factory=list)
    steps_used: int = 0
    seconds_used: float = 0.0
    llm_dollars: float = 0.0
    stop_reason: str = ""


SERIALIZED = [LoopState, CandidateState, GenerationRecord, Intervention, Diagnosis, Plan, Verdict, Finding,
              BacktestResult]
