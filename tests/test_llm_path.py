"""The meta-LLM path end to end: a local HTTP server speaking the OpenAI chat API, started by the test, with
scripted replies (a malformed JSON then a valid one; a patch that fails validation then a fixed one). One full
generation runs through LiteLLM; repairs happen; tokens, dollars and transcripts are recorded."""

from __future__ import annotations

import json
import os
import socket
from http.server import BaseHTTPRequestHandler

import pytest

from evotrainer.graph.events import EventLog

from .conftest import chat_completion, last_json, run_cli, send_json

DIAGNOSIS = {"generation": 1, "summary": "groups are dead and answers unreadable: too little signal per group",
             "bottlenecks": [{"title": "dead groups", "findings": ["dead_groups:dead_group_ratio"],
                              "severity": "warning", "evidence": [], "explanation": "zero-variance groups"}]}
PLAN = {"rationale": "hotter sampling gives groups variance",
        "interventions": [{"id": "x", "hypothesis": "If we raise the temperature to 1.2, dev accuracy improves because "
                                                    "groups get reward variance", "factor": "recipe.temperature",
                           "change": "raise the sampling temperature 1.0 -> 1.2", "target_files": ["harness.yaml"],
                           "expected": {"metric": "dev_accuracy", "direction": "up", "size": 0.01},
                           "transform": None, "sources": ["dead_groups:dead_group_ratio"]}]}  # free-form: the Coder
BAD_PATCH = {"message": "raise temperature", "edits": [{"path": "harness.yaml", "search": "  temperature: 1.0",
                                                         "replace": "  temprature: 1.2"}]}  # unknown key: invalid
GOOD_PATCH = {"message": "raise temperature", "edits": [{"path": "harness.yaml", "search": "  temperature: 1.0 ",
                                                          "replace": "  temperature: 1.2 "}]}
VERDICT = {"branch": "ignored", "decision": "promote", "reasons": ["scripted critic reviewed it"],
           "lesson": "scripted lesson: temperature 1.2 on the tiny policy"}
SCRIPT = {"diagnoser": ["Here is my analysis: {not json at all", json.dumps(DIAGNOSIS)],
          "planner": [json.dumps(PLAN)],
          "coder": [json.dumps(BAD_PATCH), "```json\n" + json.dumps(GOOD_PATCH) + "\n```"],
          "critic": [json.dumps(VERDICT)], "preflight": ["OK"]}


class ScriptedOpenAI(BaseHTTPRequestHandler):
    calls: dict[str, int] = {}
    formats: dict[str, dict | None] = {}  # the response_format of each agent's last request

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        system = next((m["content"] for m in body["messages"] if m["role"] == "system"), "")
        agent = next((a for a in ("diagnoser", "planner", "coder", "critic") if f"You are the {a.title()}" in system),
                     "preflight")
        n = self.calls.get(agent, 0)
        self.calls[agent] = n + 1
        self.formats[agent] = body.get("response_format")
        replies = SCRIPT[agent]
        content = replies[min(n, len(replies) - 1)]
        prompt_chars = sum(len(m["content"]) for m in body["messages"])
        send_json(self, chat_completion(content, model=body["model"], prompt_tokens=prompt_chars // 4,
                                        completion_tokens=len(content) // 4))


@pytest.mark.slow
def test_one_generation_through_litellm_with_repairs(scripted_llm, tiny_policy, tmp_path):
    run = tmp_path / "run"
    proc = run_cli("run", str(run), "--checkpoint", str(tiny_policy), "--skills", str(tmp_path / "skills"),
                   "--generations", "2", "--candidates", "1", "--meta-llm", "openai/scripted-meta",
                   "--api-base", scripted_llm, "--llm-cost", "1000,2000", "--max-dollars", "0.5",
                   "--train-steps", "2", "--backtest-steps", "2", "--seeds", "1",
                   "--max-seeds", "1", "--dev-items", "50", "--json",
                   env={"OPENAI_API_KEY": ""})  # a server of one's own needs no key
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = last_json(proc.stdout)
    assert summary["finished"] and summary["meta_policy"] == "meta-LLM openai/scripted-meta"
    # the dollar budget is enforced at the generation boundary: generation 1 spent it, generation 2 never started
    assert summary["generations"] == 1 and summary["stop_reason"].startswith("meta-LLM budget spent")
    assert summary["llm_dollars"] > 0.5
    assert ScriptedOpenAI.calls == {"preflight": 1, "diagnoser": 2, "planner": 1, "coder": 2, "critic": 1}
    # a server of one's own (--api-base) is sent each agent's schema, narrowed to what the call allows
    formats = ScriptedOpenAI.formats
    assert formats["preflight"] is None and formats["critic"]["json_schema"]["name"] == "Verdict"
    edit_path = formats["coder"]["json_schema"]["schema"]["$defs"]["Edit"]["properties"]["path"]["anyOf"]
    assert "harness.yaml" in edit_path[0]["enum"] and edit_path[1]["pattern"].startswith("^diagnostics/")
    plan = formats["planner"]["json_schema"]["schema"]
    assert plan["properties"]["interventions"]["minItems"] == 1 and "author" not in plan["properties"]
    intervention = plan["$defs"]["Intervention"]["properties"]
    assert "temperature" in intervention["transform"]["anyOf"][0]["enum"]
    assert (intervention["id"]["maxLength"], intervention["factor"]["maxLength"]) == (40, 80)  # names, not prose
    events = EventLog(run / "events.jsonl").read()
    repairs = [e for e in events if e["event"] == "repair"]
    assert any(e.get("agent") == "diagnoser" for e in repairs)  # malformed JSON -> repair round
    assert any(e.get("node") == "implement" and "temprature" in e["error"] for e in repairs)  # invalid patch
    calls = [e for e in events if e["event"] == "call"]
    assert {e["agent"] for e in calls} == {"diagnoser", "planner", "coder", "critic"}
    assert all(e["prompt_tokens"] > 0 and e["dollars"] > 0 for e in calls)
    assert summary["llm_dollars"] == pytest.approx(sum(e["dollars"] for e in calls), rel=1e-3)
    transcripts = run / "transcripts"
    diag = [json.loads(line) for line in (transcripts / "diagnoser.jsonl").read_text().splitlines()]
    assert len(diag) == 2 and "<rollout id=" in diag[0]["messages"][1]["content"]
    assert len((transcripts / "coder.jsonl").read_text().splitlines()) == 2
    branches = json.loads(run_cli("branches", str(run), "--json").stdout)
    assert len(branches) == 1 and branches[0]["factor"] == "recipe.temperature"
    b = branches[0]
    verdict = json.loads((run / "reports" / f"verdict-{b['branch'].replace('/', '--')}.json").read_text())
    assert verdict["author"] == "meta-LLM openai/scripted-meta" and verdict["lesson"].startswith("scripted lesson")
    # the Critic's promote was overruled: its reasons, which argue for it, are not kept; a note says so
    assert "scripted critic reviewed it" not in verdict["reasons"] and "overruled" in verdict["reasons"][-1]
    # the LLM said promote; the rule decides: a 2-step, 1-seed run cannot show a significant gain
    assert b["status"] in ("rejected", "inconclusive") and verdict["decision"] != "promote"
    assert "temperature: 1.2" in run_cli("show", str(run), b["branch"]).stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_preflight_errors_are_one_line_and_create_nothing(tmp_path):
    dead = f"http://127.0.0.1:{_free_port()}/v1"
    proc = run_cli("run", str(tmp_path / "a"), "--meta-llm", "openai/x", "--api-base", dead, "--json",
                   env={"OPENAI_API_KEY": "sk-x"})
    assert proc.returncode == 2 and proc.stderr.count("error:") == 1 and "meta-LLM openai/x at" in proc.stderr
    assert not (tmp_path / "a").exists()
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    proc = run_cli("run", str(tmp_path / "b"), "--meta-llm", "openai/gpt-4o-mini", "--json",
                   env={**env, "OPENAI_API_KEY": ""})
    assert proc.returncode == 2 and "OPENAI_API_KEY" in proc.stderr and not (tmp_path / "b").exists()
