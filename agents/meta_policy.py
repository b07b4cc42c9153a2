"""The meta-policy: the four agents the loop calls (DESIGN §1), as one protocol that both the offline rule-based
policy (`agents/offline/policy.py`) and the LLM one (`agents/llm_policy.py`) implement. The graph knows nothing
else of a policy.

What each agent is given: one input model per agent (`agents/schemas.py`), filled by one node of the loop
(`graph/nodes.py`) and handed whole to either policy. What each policy reads of it:

- Diagnoser, `diagnose(DiagnoseInput) -> Diagnosis`, node diagnose. Given: the champion line's health report
  (findings, summary), its 6 lowest-reward and 6 random rollouts, the previous diagnosis. Offline reads the findings
  and the summary; the LLM is sent all of it, rollouts quoted as data.
- Planner, `plan(PlanInput) -> Plan`, node plan. Given: the diagnosis, the findings, skills retrieved for them, the
  lineage, the champion files, the factors tried on this champion, memory's prior of each catalog transform, K.
  Offline reads the findings, skills, priors and files (the catalog's preconditions); the LLM is sent all of it,
  with the catalog transforms that apply here (each with its edit in words, the analyzers that call for it and
  its prior), and may pick one or write a free-form edit.
- Coder, `code(CodeInput) -> CodeResult`, node implement. Given: one intervention, the champion files, the
  findings, the diagnosis, the previous attempt's error. A catalog transform is written by the catalog
  (`coder.catalog_edits`) in both policies, no model is asked; the LLM is sent all of it for a free-form edit.
- Critic, `critique(CritiqueInput) -> Verdict`, node critique. Given: the promotion rule's verdict, the
  intervention, the backtest (the replay and its findings; the short run with the candidate's own findings, both
  arms' dev accuracy, train reward and train correct per seed, the gates the control arms fail, both arms scored
  under both rewards), the champion line's health report. Offline keeps the rule's verdict; the LLM is sent all of
  it and its verdict is capped by the rule (`critic.merge_llm_verdict`).
- Diagnostics revision, `revision(ReviseInput) -> Change | None`, node revise_diagnostics. Given: the judged branch,
  the reward term that rose without dev, its intervention, verdict and backtest, the champion's findings and files.
  Offline reads the term (a divergence gate on it); the LLM is sent all of it and its Coder writes one new
  `diagnostics/<id>.py`.

Decided in code for both policies, never by a model: the plan's filter (`agents/planner.py::admissible`: untried
factors, no change memory records as negative under the same diagnosis, one per factor, K at most); a catalog
transform's edit (`catalog.apply`); every edit's paths and its sandboxed validation (`agents/coder.py`, the
implement node); the promotion rule (`agents/critic.py`); a revised analyzer's validation on history before it
is committed to the champion (the revise_diagnostics node).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, runtime_checkable

from evotrainer.agents.offline.catalog import Change
from evotrainer.agents.schemas import (
    CodeInput,
    CodeResult,
    CritiqueInput,
    DiagnoseInput,
    Diagnosis,
    Plan,
    PlanInput,
    ReviseInput,
    Verdict,
)


@runtime_checkable
class MetaPolicy(Protocol):
    label: str  # who decided, in every report and verdict it writes ("offline rule-based meta-policy", "meta-LLM x")

    @property
    def dollars(self) -> float:
        """What its calls cost in this process so far (0 for the offline policy)."""
        ...

    def attach(self, run_dir: Path, on_call: Callable[[str, dict], None]) -> None:
        """Where its transcripts go (`<run_dir>/transcripts/`) and who hears of each call (the event log)."""
        ...

    def diagnose(self, inp: DiagnoseInput) -> Diagnosis:
        """Ranked bottlenecks, each citing findings and rollout ids."""
        ...

    def plan(self, inp: PlanInput) -> Plan:
        """At most `inp.k` single-factor interventions, passed through `agents.planner.admissible`."""
        ...

    def code(self, inp: CodeInput) -> CodeResult:
        """The edits that implement one intervention (a ValueError: it cannot; the loop's repair round says why)."""
        ...

    def critique(self, inp: CritiqueInput) -> Verdict:
        """The rule's verdict, kept or narrowed (never a promote the rule refused)."""
        ...

    def revision(self, inp: ReviseInput) -> Change | None:
        """A new analyzer for what no analyzer flagged, as one new `diagnostics/<id>.py` registering `<id>`; None:
        nothing to propose. The loop validates it on history before committing it."""
        ...


def connect(meta_llm: str, api_base: str | None = None, *, cost: list[float] | tuple[float, float] | None = None,
            timeout_s: float | None = None, retries: int | None = None) -> MetaPolicy:
    """The policy `--meta-llm` names: `offline` (the rules), `local` or `local:<model>` (the local server on
    127.0.0.1, started or reused: `agents/local_llm.py`), or a LiteLLM model string; an LLM policy has answered its
    preflight call."""
    if meta_llm == "offline":
        from evotrainer.agents.offline.policy import OfflinePolicy

        return OfflinePolicy()
    from evotrainer.agents.llm_policy import LLMPolicy

    if meta_llm == "local" or meta_llm.startswith("local:"):
        from evotrainer.agents import local_llm
        from evotrainer.base.errors import UserError

        if api_base:
            raise UserError("--meta-llm local starts its own server on 127.0.0.1: drop --api-base, or name the "
                            "server's model with --meta-llm openai/MODEL --api-base URL")
        model, base = local_llm.ensure_server(meta_llm.partition(":")[2] or local_llm.DEFAULT_MODEL)
        return LLMPolicy.connect(model, base, cost_per_mtok=(0.0, 0.0), timeout_s=timeout_s or local_llm.TIMEOUT_S,
                                 retries=retries, schema_format=True, api_key="local",
                                 max_tokens=local_llm.MAX_NEW_TOKENS)
    # a server of one's own (vLLM, llama.cpp, Ollama, LM Studio) takes OpenAI's json_schema response format and
    # constrains decoding to it; a hosted provider is left to LiteLLM's own handling and the repair round
    # (and a server of one's own needs no key: the OpenAI client insists on one, so it is sent a placeholder)
    keyless = api_base and meta_llm.startswith("openai/") and not os.environ.get("OPENAI_API_KEY")
    return LLMPolicy.connect(meta_llm, api_base, cost_per_mtok=tuple(cost) if cost else None, timeout_s=timeout_s,
                             retries=retries, schema_format=bool(api_base), api_key="none" if keyless else None)
