"""The four agents over a meta-LLM: Diagnoser, Planner, Coder, Critic, each a prompt file under
`agents/prompts/` plus the JSON schema of its typed output, sent through the one `LLMClient`.

What the LLM may not decide is decided in code: the Planner's interventions are cut to K distinct factors
not yet tried on this champion (and not recorded negative for the same diagnosis); the Coder's edits go
through `apply_edits` and the sandboxed validation; the Critic's verdict is capped by the promotion rule
(`merge_llm_verdict`). Diagnostics revision uses the catalog's divergence gate in both modes: it is code
validated on history, not a judgement.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from evotrainer.agents.critic import merge_llm_verdict
from evotrainer.agents.llm import LLMClient, LLMError
from evotrainer.agents.offline.catalog import CATALOG
from evotrainer.agents.offline.policy import OfflinePolicy
from evotrainer.agents.schemas import (
    CodeInput,
    CodeResult,
    DiagnoseInput,
    Diagnosis,
    Intervention,
    Plan,
    PlanInput,
    Sample,
    Verdict,
)
from evotrainer.trainer.backtest import BacktestResult
from evotrainer.workspaces.repo import slugify

PROMPTS = Path(__file__).parent / "prompts"


def _system(agent: str, schema) -> str:
    return (PROMPTS / f"{agent}.md").read_text().strip() + \
        "\n\nReply with one JSON object, no prose, matching this JSON schema:\n" + \
        json.dumps(schema.model_json_schema(), separators=(",", ":"))


def _quote(samples: list[Sample]) -> str:
    """Rollouts as data: each inside <rollout> tags, its text JSON-escaped and its `&`, `<`, `>` as entities, so a
    completion that writes `</rollout>` cannot close the tag."""
    return "\n".join(f"<rollout id={s.rollout_id!r} reward={s.reward:.3f} correct={s.correct} "
                     f"truncated={s.truncated}>"
                     f"{html.escape(json.dumps({'prompt': s.prompt, 'completion': s.completion}), quote=False)}"
                     "</rollout>" for s in samples)


class LLMPolicy:
    def __init__(self, client: LLMClient):
        self.client = client
        self.label = f"meta-LLM {client.model}"
        self._offline = OfflinePolicy()

    @classmethod
    def connect(cls, model: str, api_base: str | None = None, *, cost_per_mtok: tuple[float, float] | None = None,
                timeout_s: float | None = None, retries: int | None = None) -> LLMPolicy:
        """A policy whose endpoint answered the preflight call (timeout and attempts: the client's defaults when
        None)."""
        limits = {k: v for k, v in dict(timeout_s=timeout_s, retries=retries).items() if v is not None}
        client = LLMClient(model, api_base, cost_per_mtok=cost_per_mtok, **limits)
        client.preflight()
        return cls(client)

    def attach(self, run_dir: Path, on_call) -> None:
        """Transcripts into the run directory, each call's cost and each repair to the event log."""
        self.client.transcripts = Path(run_dir) / "transcripts"
        self.client.on_call = on_call

    @property
    def dollars(self) -> float:
        return self.client.dollars

    def diagnose(self, inp: DiagnoseInput) -> Diagnosis:
        r = inp.report
        user = "\n\n".join([
            f"Generation {inp.generation}. Health report summary: {json.dumps(r.summary)}",
            "Findings:\n" + "\n".join(json.dumps(f.model_dump()) for f in r.findings),
            "Lowest-reward rollouts:\n" + _quote(inp.worst),
            "Random rollouts:\n" + _quote(inp.random),
            "Earlier diagnoses:\n" + "\n".join(d.summary for d in inp.previous) if inp.previous else "",
        ])
        out, _ = self.client.structured("diagnoser", _system("diagnoser", Diagnosis), user, Diagnosis)
        return out.model_copy(update={"generation": inp.generation, "author": self.label})

    def plan(self, inp: PlanInput) -> Plan:
        skills = [{"id": h.skill.id, "score": round(h.score, 3), "outcome": h.skill.outcome, "factor": h.skill.factor,
                   "transform": h.skill.transform, "effect": h.skill.effect, "ci": [h.skill.ci_low, h.skill.ci_high],
                   "trigger": h.skill.trigger.text, "lesson": h.skill.lesson} for h in inp.skills]
        catalog = {t.id: f"{t.factor}: {t.summary}" for t in CATALOG.values() if t.kind != "diagnostics"}
        user = "\n\n".join([
            f"K = {inp.k}. Domain {inp.domain}, generation {inp.generation}.",
            f"Diagnosis: {inp.diagnosis.model_dump_json()}",
            "Findings:\n" + "\n".join(json.dumps(f.model_dump(exclude={'evidence'})) for f in inp.findings),
            f"Skills from memory: {json.dumps(skills)}",
            f"Lineage: {json.dumps([e.model_dump() for e in inp.lineage])}",
            f"Factors already tried on this champion (tried): {json.dumps(inp.tried)}",
            f"Catalog transforms: {json.dumps(catalog)}",
            "Champion harness files:\n" + "\n".join(f"--- {p}\n{t}" for p, t in inp.files.items()),
        ])
        out, _ = self.client.structured("planner", _system("planner", Plan), user, Plan)
        negative = {(h.skill.factor, h.skill.transform) for h in inp.skills if h.skill.outcome == "negative"
                    and set(h.skill.trigger.analyzers) == {f.analyzer for f in inp.findings if f.severity != "info"}}
        kept: list[Intervention] = []
        for iv in out.interventions:
            if iv.factor in inp.tried or iv.factor in {k.factor for k in kept}:
                continue
            transform = iv.transform if iv.transform in CATALOG else None
            if (iv.factor, transform) in negative:
                continue
            kept.append(iv.model_copy(update={"id": f"g{inp.generation}-{slugify(iv.factor)}",
                                              "transform": transform}))
        return Plan(interventions=kept[:inp.k], rationale=out.rationale, author=self.label)

    def code(self, inp: CodeInput) -> CodeResult:
        user = "\n\n".join([
            f"Intervention: {inp.intervention.model_dump_json()}",
            f"Attempt {inp.attempt + 1}. Error of the previous attempt: {inp.error or 'none'}",
            "Harness files:\n" + "\n".join(f"--- {p}\n{t}" for p, t in inp.files.items()),
        ])
        out, _ = self.client.structured("coder", _system("coder", CodeResult), user, CodeResult)
        return out

    def critique(self, verdict: Verdict, intervention: Intervention, backtest: BacktestResult | None) -> Verdict:
        """The rule's verdict reviewed by the LLM Critic. With no backtest there is nothing to review, and a Critic
        that gives no usable answer leaves the rule's verdict as it is (the failure goes to the event log): the
        rule alone can decide, so a review is never worth ending the run for."""
        if backtest is None:
            return verdict
        bt = backtest.model_dump(exclude={"short_run": {"arms", "findings"}, "replay": {"findings"}})
        user = "\n\n".join([f"Intervention: {intervention.model_dump_json()}",
                            f"Verdict of the promotion rule: {verdict.model_dump_json()}",
                            f"Backtest: {json.dumps(bt, default=str)}"])
        try:
            out, _ = self.client.structured("critic", _system("critic", Verdict), user, Verdict)
        except LLMError as e:
            if self.client.on_call:
                self.client.on_call("critic", {"kind": "critic_fallback", "agent": "critic", "branch": verdict.branch,
                                               "error": str(e)})
            return verdict
        return merge_llm_verdict(verdict, out.model_copy(update={"branch": verdict.branch}))

    def revision(self, files: dict[str, str], culprit: str):
        return self._offline.revision(files, culprit)
