"""The LangGraph state machine of DESIGN §1, and `run` / `resume` over it.

    train -> diagnose -> plan -> implement -> backtest -> critique -> promote -> [revise_diagnostics] -> distill
      ^                                                                                                    |
      +---------------------------------------- next generation (budget left) ----------------------------+

Diagnostics revision runs after promote so that the branch that asked for it is already judged (tagged)
when the new analyzer is validated on history. The checkpointer is `SqliteSaver` on `graph.sqlite` with
synchronous durability: every completed node is on disk before the next starts, so a killed run resumes
at the node it was in.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from pydantic import BaseModel

from evotrainer.agents.meta_policy import MetaPolicy
from evotrainer.agents.schemas import Bottleneck, ExpectedEffect
from evotrainer.base.config import loop_config
from evotrainer.base.errors import UserError
from evotrainer.base.files import atomic_write_text
from evotrainer.graph.events import EventLog
from evotrainer.graph.nodes import Loop
from evotrainer.graph.state import SERIALIZED, GenerationRecord, LoopState
from evotrainer.memory.store import SkillStore
from evotrainer.trainer import executor
from evotrainer.trainer.sandbox import isolation_mode
from evotrainer.workspaces.run import RunWorkspace
from evotrainer.workspaces.source import StartingHarness

THREAD = {"configurable": {"thread_id": "evotrainer"}}
NODES = ("train", "diagnose", "plan", "implement", "backtest", "critique", "promote", "revise_diagnostics",
         "distill")


def build(loop: Loop, checkpointer) -> object:
    """The compiled graph: every edge of the loop is here."""
    g = StateGraph(LoopState)
    for name in NODES:
        g.add_node(name, loop.node(name, getattr(loop, name)))
    g.add_edge(START, "train")
    for a, b in zip(NODES[:6], NODES[1:7]):  # train -> ... -> promote
        g.add_edge(a, b)
    g.add_conditional_edges("promote", lambda s: "revise_diagnostics" if s.revise else "distill",
                            ["revise_diagnostics", "distill"])
    g.add_edge("revise_diagnostics", "distill")
    g.add_conditional_edges("distill", lambda s: END if loop.stop_reason(s) else "train", ["train", END])
    return g.compile(checkpointer=checkpointer)


def checkpointer(path: Path) -> SqliteSaver:
    serde = JsonPlusSerializer(allowed_msgpack_modules=[*SERIALIZED, Bottleneck, ExpectedEffect])
    return SqliteSaver(sqlite3.connect(str(path), check_same_thread=False), serde=serde)


def has_started(run: Path) -> bool:
    """Whether the run's graph has a checkpoint, read without writing (a SqliteSaver creates its tables on open):
    False for a run made by `init` and never started, or one whose start failed before its first node."""
    db = Path(run) / "graph.sqlite"
    if not db.is_file():
        return False
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            return con.execute("SELECT 1 FROM checkpoints LIMIT 1").fetchone() is not None
        finally:
            con.close()
    except sqlite3.OperationalError as e:
        if "no such table" in str(e):
            return False
        raise UserError(f"run {run}: its graph checkpoint {db} cannot be read ({e}); restore the run directory "
                        "from a copy") from None
    except sqlite3.DatabaseError as e:
        raise UserError(f"run {run}: its graph checkpoint {db} is corrupt ({e}); restore the run directory from a "
                        "copy") from None


class RunSummary(BaseModel):
    run: str
    meta_policy: str
    finished: bool
    stop_reason: str
    generations: int
    dev_start: float | None
    dev_final: float | None
    promoted: list[str]
    rejected: list[str]
    candidates: int
    steps_used: int
    seconds_used: float
    llm_dollars: float
    skills: int
    history: list[GenerationRecord]

    def markdown(self) -> str:
        lines = [f"# Run {self.run}", "",
                 f"Meta-policy: {self.meta_policy}. {'Finished' if self.finished else 'Stopped'}: {self.stop_reason}.",
                 f"Dev accuracy {self.dev_start} -> {self.dev_final}; {self.candidates} candidates, "
                 f"{len(self.promoted)} promoted; {self.steps_used} GRPO steps, {self.seconds_used:.0f} s, "
                 f"${self.llm_dollars:.2f} of meta-LLM.", "",
                 "| gen | champion | dev after train | dev at end | promoted | revised |", "|---|---|---|---|---|---|"]
        for h in self.history:
            lines.append(f"| {h.generation} | {h.champion_commit[:8]} | {h.dev_trained} | {h.dev_accuracy} | "
                         f"{h.promoted or '-'} | {h.revised or '-'} |")
        if self.rejected:
            lines += ["", "Not promoted (rejected or inconclusive):", *[f"- {r}" for r in self.rejected]]
        return "\n".join(lines) + "\n"


def summarize(ws: RunWorkspace, state: LoopState, meta_label: str, finished: bool, stop: str,
              skills: int) -> RunSummary:
    hist = state.history
    return RunSummary(
        run=str(ws.path), meta_policy=meta_label, finished=finished, stop_reason=stop, generations=len(hist),
        dev_start=state.dev_start, dev_final=hist[-1].dev_accuracy if hist else state.dev_trained,
        promoted=[h.promoted for h in hist if h.promoted], rejected=[r for h in hist for r in h.rejected],
        candidates=sum(len(h.candidates) for h in hist), steps_used=state.steps_used,
        seconds_used=state.seconds_used, llm_dollars=state.llm_dollars, skills=skills,
        history=list(hist))


def drive(ws: RunWorkspace, meta: MetaPolicy, *, fresh: bool | None, feed: Callable | None = None,
          status: Callable[[str], None] | None = None) -> RunSummary:
    """Run the loop from its start (`fresh`) or from the last completed node (`fresh=False`), under the run's lock;
    `fresh=None` starts or resumes, whichever the run's graph checkpoint calls for."""
    cfg = ws.config()
    if fresh is False and not has_started(ws.path):  # refused before the lock and the checkpointer create files
        raise UserError(f"run {ws.path} has not started yet: start it with `evotrainer run {ws.path}`")
    events = EventLog(ws.path / "events.jsonl")
    store = SkillStore(cfg.skills) if cfg.skills else SkillStore()
    with ws.lock():
        removed = ws.harness.prune_worktrees(ws.path / "worktrees")
        # a meta-LLM's transcripts in the run, every call's cost in the event log (the offline policy has none)
        meta.attach(ws.path, lambda agent, record: events.emit(record.pop("kind", "call"), **record))
        loop = Loop(ws, meta, store, events, feed=feed, status=status)
        saver = checkpointer(ws.path / "graph.sqlite")
        try:
            graph = build(loop, saver)
            config = {**THREAD, "recursion_limit": 12 * cfg.budget.generations + 20}
            snapshot = graph.get_state(THREAD)
            if fresh is None:
                fresh = not snapshot.values
            if fresh and snapshot.values:
                raise UserError(f"run {ws.path} has already started: continue it with `evotrainer resume {ws.path}`")
            if not fresh and not snapshot.values:
                raise UserError(f"run {ws.path} has not started yet: start it with `evotrainer run {ws.path}`")
            events.emit("run_start" if fresh else "resume", meta_policy=meta.label, removed_worktrees=removed,
                        isolation=isolation_mode(),  # refuses here, before any work, where bwrap is missing
                        executor=executor.current().name)
            started, jobs_before = time.time(), executor.current().jobs.copy()
            if fresh or snapshot.next:
                graph.invoke(LoopState() if fresh else None, config, durability="sync")
            snapshot = graph.get_state(THREAD)
        finally:
            saver.conn.close()
        state = LoopState.model_validate(snapshot.values)
        finished = not snapshot.next
        stop = loop.stop_reason(state) if finished else "interrupted"
        summary = summarize(ws, state, meta.label, finished, stop, len(store))
        atomic_write_text(ws.path / "reports" / "summary.json", summary.model_dump_json(indent=2))
        atomic_write_text(ws.path / "reports" / "summary.md", summary.markdown())
        # the jobs this process ran (or sent to Ray) for the run, by kind; a short-run arm's own jobs ran inside it
        events.emit("run_end", stop_reason=stop, seconds=round(time.time() - started, 1),
                    executor=executor.current().name, jobs=dict(executor.current().jobs - jobs_before))
        return summary


def open_run(directory: Path, *, domain: str, budget: dict, meta_llm: str, api_base: str | None,
             skills: str | None, checkpoint: str | None, seed: int, loop_overrides: dict | None = None,
             llm_cost: list[float] | None = None, llm_timeout_s: float | None = None,
             llm_retries: int | None = None, harness: StartingHarness | None = None) -> RunWorkspace:
    """A new run at `directory` with these settings (RunWorkspace.create refuses a directory that holds one),
    its harness repository started from `harness` (default: the domain's template)."""
    if checkpoint and not (Path(checkpoint) / "config.json").is_file():
        raise UserError(f"checkpoint {checkpoint} not found or not a model directory (no config.json)")
    return RunWorkspace.create(directory, domain, seed=seed, harness=harness,
                               budget=budget,
                               meta_llm=meta_llm, api_base=api_base, skills=skills, llm_cost_per_mtok=llm_cost,
                               llm_timeout_s=llm_timeout_s, llm_retries=llm_retries,
                               checkpoint=str(Path(checkpoint).resolve()) if checkpoint else None,
                               loop=loop_config(domain, loop_overrides))
