"""The loop's state: one typed object, checkpointed by LangGraph after every node (DESIGN §1).

Heavy artefacts (health reports, backtests, transcripts) live as files in the run directory; the state
holds what routing and the next node need, and paths to the rest.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from evotrainer.agents.schemas import Diagnosis, Intervention, Plan, Verdict
from evotrainer.trainer.diagnostics import Finding


class CandidateState(BaseModel):
    intervention: Intervention
    branch: str = ""
    commit: str = ""
    attempts: int = 0
    error: str = Field("", description="why it never reached a backtest (edit, validation, crash)")
    backtest: str = Field("", description="path of its reports/backtest-*.json")
    verdict: Verdict | None = None


class GenerationRecord(BaseModel):
    """One row of the final summary: what a generation did."""

    generation: int
    champion_commit: str
    checkpoint: str
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


SERIALIZED = [LoopState, CandidateState, GenerationRecord, Intervention, Diagnosis, Plan, Verdict, Finding]
