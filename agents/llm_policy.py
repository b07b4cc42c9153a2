"""The four agents over a meta-LLM: Diagnoser, Planner, Coder, Critic, each a prompt file under
`agents/prompts/` plus the JSON schema of its typed output, sent through the one `LLMClient`. It implements
`agents/meta_policy.py::MetaPolicy`; what each agent is sent is tabled there.

What the LLM may not decide is decided in code, as for the offline policy: the Planner's interventions go through
the Planners' one filter (`agents/planner.py::admissible`); a catalog transform the Planner picks is written by
the catalog (`coder.catalog_edits`), exactly as the offline policy writes it; the Coder's edits go through
`apply_edits` and the sandboxed validation; the Critic's verdict is capped by the promotion rule
(`merge_llm_verdict`); an analyzer the Coder writes for diagnostics revision is one new `diagnostics/<id>.py`,
validated on history by the loop before it reaches the champion.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from evotrainer.agents.coder import EditFailed, apply_edits, catalog_edits
from evotrainer.agents.critic import merge_llm_verdict
from evotrainer.agents.llm import LLMClient, LLMError
from evotrainer.agents.offline.catalog import CATALOG, Change, apply
from evotrainer.agents.planner import admissible
from evotrainer.agents.schemas import (
    CodeInput,
    CodeResult,
    CritiqueInput,
    DiagnoseInput,
    Diagnosis,
    ExpectedEffect,
    Plan,
    PlanInput,
    ReviseInput,
    Sample,
    Verdict,
)
from evotrainer.trainer.diagnostics import Finding
from evotrainer.trainer.evidence import ROLLOUT_SCHEMA, STEP_SCHEMA
from evotrainer.workspaces.repo import slugify

PROMPTS = Path(__file__).parent / "prompts"
REVISION_ATTEMPTS = 2  # the Coder's analyzer, then one repair round with the reason it was refused


def _system(prompt: str, schema: type[BaseModel] | dict) -> str:
    return (PROMPTS / f"{prompt}.md").read_text().strip() + \
        "\n\nReply with one JSON object, no prose, matching this JSON schema:\n" + \
        json.dumps(schema if isinstance(schema, dict) else schema.model_json_schema(), separators=(",", ":"))


NEW_ANALYZER = {"type": "string", "pattern": r"^diagnostics/[a-z][a-z0-9_]*\.py$"}


def narrowed(model: type[BaseModel], *, values: dict[str, dict] | None = None, bounds: dict[str, dict] | None = None,
             drop: tuple[str, ...] = (), require: tuple[str, ...] = ()) -> dict:
    """`model`'s JSON schema narrowed to what this call allows: the schema the model is shown and a constraining
    server decodes to. Fields are named `<Model>__<field>` (`Edit__path`): `values` replaces what a field may hold
    (an enum, a pattern), `bounds` adds to it (`minItems`); `drop` removes top-level fields the model does not write
    (the author) and `require` makes top-level fields with defaults required (a plan with its interventions). The
    reply is still validated by `model` and checked in code as before: this only keeps a model that follows the
    schema inside the menu."""
    schema = model.model_json_schema()

    def node(where: str) -> tuple[dict, str]:
        name, field = where.split("__")
        return (schema if name == model.__name__ else schema["$defs"][name])["properties"], field

    for where, allowed in (values or {}).items():
        props, field = node(where)
        props[field] = {**{k: v for k, v in props[field].items() if k in ("title", "description", "default")},
                        **allowed}
    for where, extra in (bounds or {}).items():
        props, field = node(where)
        props[field] = {**props[field], **extra}
    for field in drop:
        schema["properties"].pop(field)
    schema["required"] = [f for f in schema.get("required", []) if f not in drop] + \
        [f for f in require if f not in schema.get("required", [])]
    return schema


def _one_of(values, *, nullable: bool = False, new: dict | None = None) -> dict:
    options = ([{"enum": sorted(values)}] if values else []) + ([new] if new else []) + \
        ([{"type": "null"}] if nullable else [])
    return options[0] if len(options) == 1 else {"anyOf": options}


def _quote(samples: list[Sample]) -> str:
    """Rollouts as data: each inside <rollout> tags, its text JSON-escaped and its `&`, `<`, `>` as entities, so a
    completion that writes `</rollout>` cannot close the tag."""
    return "\n".join(f"<rollout id={s.rollout_id!r} reward={s.reward:.3f} correct={s.correct} "
                     f"truncated={s.truncated}>"
                     f"{html.escape(json.dumps({'prompt': s.prompt, 'completion': s.completion}), quote=False)}"
                     "</rollout>" for s in samples)


def _findings(findings: list[Finding]) -> str:
    """One finding a line, without its rollout ids (the agents that read them are sent the rollouts)."""
    return "\n".join(json.dumps(f.model_dump(exclude={"evidence"})) for f in findings) or "none"


def _files(files: dict[str, str]) -> str:
    return "\n".join(f"--- {p}\n{t}" for p, t in files.items())


def catalog_menu(inp: PlanInput) -> dict[str, Change]:
    """The catalog transforms a candidate may be (not diagnostics) whose precondition holds on this harness with these
    findings, each with the change it would make."""
    return {t.id: change for t in CATALOG.values() if t.kind != "diagnostics"
            and (change := apply(t.id, inp.files, inp.findings)) is not None}


class LLMPolicy:
    def __init__(self, client: LLMClient):
        self.client = client
        self.label = f"meta-LLM {client.model}"

    @classmethod
    def connect(cls, model: str, api_base: str | None = None, *, cost_per_mtok: tuple[float, float] | None = None,
                timeout_s: float | None = None, retries: int | None = None, **client_options) -> LLMPolicy:
        """A policy whose endpoint answered the preflight call (timeout and attempts: the client's defaults when
        None; `client_options`: the rest of `LLMClient`'s, e.g. `schema_format`)."""
        limits = {k: v for k, v in dict(timeout_s=timeout_s, retries=retries).items() if v is not None}
        client = LLMClient(model, api_base, cost_per_mtok=cost_per_mtok, **limits, **client_options)
        client.preflight()
        return cls(client)

    def attach(self, run_dir: Path, on_call: Callable[[str, dict], None]) -> None:
        """Transcripts into the run directory, each call's cost and each repair to the event log."""
        self.client.transcripts = Path(run_dir) / "transcripts"
        self.client.on_call = on_call

    @property
    def dollars(self) -> float:
        return self.client.dollars

    def _note(self, agent: str, record: dict) -> None:
        if self.client.on_call:
            self.client.on_call(agent, record)

    def diagnose(self, inp: DiagnoseInput) -> Diagnosis:
        r = inp.report
        user = "\n\n".join([
            f"Generation {inp.generation}. Health report summary: {json.dumps(r.summary)}",
            "Findings:\n" + "\n".join(json.dumps(f.model_dump()) for f in r.findings),
            "Lowest-reward rollouts:\n" + _quote(inp.worst),
            "Random rollouts:\n" + _quote(inp.random),
            "Earlier diagnoses:\n" + "\n".join(d.summary for d in inp.previous) if inp.previous else "",
        ])
        shape = narrowed(Diagnosis, drop=("author",), require=("bottlenecks",))
        out, _ = self.client.structured("diagnoser", _system("diagnoser", shape), user, Diagnosis, shape)
        return out.model_copy(update={"generation": inp.generation, "author": self.label})

    def plan(self, inp: PlanInput) -> Plan:
        """The LLM's interventions, a catalog pick made exact (its factor, files and change in words are the
        catalog's; one that does not apply here is dropped), then the Planners' one filter and K."""
        skills = [{"id": h.skill.id, "score": round(h.score, 3), "outcome": h.skill.outcome, "factor": h.skill.factor,
                   "transform": h.skill.transform, "effect": h.skill.effect, "ci": [h.skill.ci_low, h.skill.ci_high],
                   "trigger": h.skill.trigger.text, "lesson": h.skill.lesson} for h in inp.skills]
        menu = catalog_menu(inp)
        catalog = {}
        for tid, change in menu.items():
            t, prior = CATALOG[tid], inp.priors.get(tid)
            catalog[tid] = {"factor": t.factor, "summary": t.summary, "change": change.change,
                            "files": sorted(change.files),
                            "called_for_by": sorted({f.analyzer for f in inp.findings
                                                     if f.analyzer in t.relevance and f.severity != "info"}),
                            "memory": {"tests": prior.n, "effect": round(prior.mean, 4), "sd": round(prior.sd, 4)}
                            if prior and prior.n else None}
        user = "\n\n".join([
            f"K = {inp.k}. Domain {inp.domain}, generation {inp.generation}.",
            f"Diagnosis: {inp.diagnosis.model_dump_json()}",
            "Findings:\n" + _findings(inp.findings),
            f"Skills from memory: {json.dumps(skills)}",
            f"Lineage: {json.dumps([e.model_dump() for e in inp.lineage])}",
            f"Factors already tried on this champion (tried): {json.dumps(inp.tried)}",
            "Catalog transforms that apply to this harness (`transform`: its id; memory: what earlier backtests "
            f"measured of it on sealed dev): {json.dumps(catalog)}",
            "Champion harness files:\n" + _files(inp.files),
        ])
        # an intervention's id and factor are names (the id is replaced below in any case): a model kept to the
        # schema writes a name, not a paragraph (a 135M model fills every open string to its bound)
        shape = narrowed(Plan, values={"Intervention__transform": _one_of(menu, nullable=True)},
                         bounds={"Plan__interventions": {"minItems": 1, "maxItems": max(1, inp.k)},
                                 "Intervention__id": {"maxLength": 40}, "Intervention__factor": {"maxLength": 80}},
                         drop=("author",), require=("interventions", "rationale"))
        out, _ = self.client.structured("planner", _system("planner", shape), user, Plan, shape)
        proposed, notes = [], []
        for iv in out.interventions:
            if iv.transform in menu:
                change = menu[iv.transform]
                proposed.append(iv.model_copy(update={
                    "id": f"g{inp.generation}-{iv.transform}", "factor": CATALOG[iv.transform].factor,
                    "change": change.change, "target_files": sorted(change.files),
                    "hypothesis": iv.hypothesis.strip() or change.hypothesis}))
            elif iv.transform in CATALOG:
                notes.append(f"{iv.transform} dropped: the catalog transform does not apply to this harness")
            else:  # free-form: the Coder writes it
                proposed.append(iv.model_copy(update={"id": f"g{inp.generation}-{slugify(iv.factor)}",
                                                      "transform": None}))
        kept, skipped = admissible(proposed, inp)
        notes += skipped
        return Plan(interventions=kept[:inp.k], author=self.label,
                    rationale=out.rationale + ("; " + "; ".join(notes) if notes else ""))

    def code(self, inp: CodeInput) -> CodeResult:
        """A catalog transform as the catalog writes it (no call); a free-form intervention by the LLM Coder, given
        the diagnosis and the findings it answers."""
        if inp.intervention.transform in CATALOG:
            return catalog_edits(inp, f"catalog transform {inp.intervention.transform}, planned by {self.label}")
        diagnosis = inp.diagnosis.model_dump_json(include={"summary", "bottlenecks"}) if inp.diagnosis else "none"
        user = "\n\n".join([
            f"Intervention: {inp.intervention.model_dump_json()}",
            f"Diagnosis it answers: {diagnosis}",
            "Findings of the champion's health report:\n" + _findings(inp.findings),
            f"Attempt {inp.attempt + 1}. Error of the previous attempt: {inp.error or 'none'}",
            "Harness files:\n" + _files(inp.files),
        ])
        shape = narrowed(CodeResult, values={"Edit__path": _one_of(inp.files, new=NEW_ANALYZER)})
        out, _ = self.client.structured("coder", _system("coder", shape), user, CodeResult, shape)
        return out

    def critique(self, inp: CritiqueInput) -> Verdict:
        """The rule's verdict reviewed by the LLM Critic, given the whole backtest and both arms' health. With no
        backtest there is nothing to review, and a Critic that gives no usable answer leaves the rule's verdict as it
        is (the failure goes to the event log): the rule alone can decide, so a review is never worth ending the
        run for."""
        verdict, bt = inp.verdict, inp.backtest
        if bt is None:
            return verdict
        every = {"__all__": {"evidence"}}  # rollout ids: the Critic is sent no rollouts to look them up in
        data = bt.model_dump(mode="json", exclude={"short_run": {"findings"}, "replay": {"findings": every}})
        s = bt.short_run
        health = [f"Candidate arms, their own short-run evidence under the champion's thresholds (its analyzers "
                  f"included):\n{_findings(s.findings)}" if s else "No short run: the replay decided.",
                  "Control arms (the champion harness): gates they fail on their own short-run evidence: "
                  f"{json.dumps(s.control_gates) if s else 'not run'}",
                  "The champion line's health report this generation (the harness the control arms train under):\n"
                  + _findings(inp.findings)]
        user = "\n\n".join([f"Intervention: {inp.intervention.model_dump_json()}",
                             f"Verdict of the promotion rule: {verdict.model_dump_json()}",
                             f"Backtest: {json.dumps(data)}",
                             "Health of both arms:\n" + "\n\n".join(health)])
        try:
            out, _ = self.client.structured("critic", _system("critic", Verdict), user, Verdict)
        except LLMError as e:
            self._note("critic", {"kind": "critic_fallback", "agent": "critic", "branch": verdict.branch,
                                  "error": str(e)})
            return verdict
        return merge_llm_verdict(verdict, out.model_copy(update={"branch": verdict.branch}))

    def revision(self, inp: ReviseInput) -> Change | None:
        """A new analyzer written by the LLM Coder for what no analyzer flagged on `inp.branch`: one new
        `diagnostics/<id>.py` that registers `<id>`, refused here otherwise (one repair round with the reason). None
        when the Coder gives none; the loop then records no revision. It is harness code: it runs only in the
        isolated child that validates it on history."""
        s = inp.backtest.short_run if inp.backtest else None
        anomaly = {"branch": inp.branch, "intervention": inp.intervention.model_dump(mode="json"),
                   "verdict": inp.verdict.model_dump(mode="json") if inp.verdict else None,
                   "reward_term_that_rose": inp.culprit,
                   "short_run": s.model_dump(mode="json", include={"delta", "ci_low", "ci_high", "train_reward_delta",
                                                                  "train_correct_delta", "cross"}) if s else None}
        columns = [f.name for f in ROLLOUT_SCHEMA] + ["reward_<component>"]
        user = "\n\n".join([
            f"The anomaly no analyzer flagged: {json.dumps(anomaly)}",
            "The candidate's own short-run findings:\n" + (_findings(s.findings) if s else "none"),
            "The champion line's health report:\n" + _findings(inp.findings),
            f"Rollout columns: {json.dumps(columns)}. Step columns: {json.dumps([f.name for f in STEP_SCHEMA])}.",
            "Champion harness files:\n" + _files(inp.files),
        ])
        error = ""
        for attempt in range(REVISION_ATTEMPTS):
            ask = user + (f"\n\nYour previous analyzer was refused: {error}" if error else "")
            try:
                shape = narrowed(CodeResult, values={"Edit__path": NEW_ANALYZER})
                out, _ = self.client.structured("coder", _system("analyzer", shape), ask, CodeResult, shape)
                return self._analyzer(inp, out)
            except LLMError as e:
                error = str(e)
                break
            except EditFailed as e:
                error = str(e)
                self._note("coder", {"kind": "repair", "agent": "coder", "attempt": attempt + 1, "error": error})
        self._note("coder", {"kind": "revision_failed", "agent": "coder", "branch": inp.branch, "error": error})
        return None

    @staticmethod
    def _analyzer(inp: ReviseInput, out: CodeResult) -> Change:
        """The Coder's reply as one new analyzer file, or EditFailed saying why not."""
        changed = apply_edits(inp.files, out.edits)
        path = next(iter(changed))
        aid = Path(path).stem
        if len(changed) != 1 or not path.startswith("diagnostics/") or path in inp.files:
            raise EditFailed(f"a revision adds exactly one new file diagnostics/<id>.py and changes nothing else "
                             f"(got {', '.join(sorted(changed))})")
        if not aid.isidentifier() or not any(f"@analyzer({q}{aid}{q}" in changed[path] for q in "\"'"):
            raise EditFailed(f"{path} must register its analyzer under the file's name: @analyzer(\"{aid}\", ...)")
        return Change(files=changed, change=out.message,
                      hypothesis=f"If {aid} had run, {inp.branch} would have been flagged before its verdict, and no "
                                 "promoted branch would have been.",
                      expected=ExpectedEffect(metric="missed_gates", direction="down", size=1))
