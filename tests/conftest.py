"""Shared fixtures: offline switches, a private policy cache, and a tiny warm policy built once per session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from evotrainer.base.settings import apply_offline_switches

apply_offline_switches()
# one torch thread per warm-up: the tiny policies gain little from two (13.0 s vs 13.7 s for the math one, measured),
# and a thread per core stalls when other processes share the cores (the SWE fixture, warm-up and 2 steps: 110 s with
# two threads, 41 s with one, on the same shared machine)
os.environ.setdefault("EVOTRAINER_WARMUP_THREADS", "1")

# a policy small enough that warm-up and a few GRPO steps take seconds: tests check mechanics, not accuracy
TINY_MODEL = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64, "max_positions": 160}
TINY_WARMUP = {"target_accuracy": 0.99, "max_steps": 150, "eval_every": 150, "eval_items": 50}


# seconds each file's tests took (setup, call and teardown summed: `make test` with `--durations=0`, two workers, idle,
# 2026-12-07): they start longest first. Only the order depends on these figures, never a result.
FILE_SECONDS = {"test_loop.py": 233, "test_compare.py": 210, "test_line.py": 147, "test_local_llm.py": 146,
                "test_backtest.py": 140, "test_executor.py": 114, "test_swe_training.py": 78, "test_abuse_loop.py": 74,
                "test_train_cli.py": 68, "test_code_training.py": 68, "test_llm_path.py": 59, "test_pretrained.py": 52,
                "test_abuse.py": 36, "test_flawed.py": 30, "test_ranks.py": 29, "test_llm_client.py": 28,
                "test_resume.py": 23, "test_sandbox.py": 21, "test_workspace.py": 20, "test_agents.py": 19,
                "test_memory.py": 18, "test_grading.py": 12, "test_code_domain.py": 12, "test_program_sandbox.py": 11}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first (the measured ones by their time, then any other with a slow test), each file's tests
    in their order: under pytest-xdist (`--dist loadfile`) the long files start early and the short ones fill the
    gaps, instead of one worker finishing a long file alone (a greedy longest-first schedule)."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: -FILE_SECONDS.get(item.path.name, 1 if item.path in slow else 0))


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """The session's policy cache: under pytest-xdist, one folder shared by the workers of this run."""
    base = tmp_path_factory.getbasetemp()
    path = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "policy-cache"
    path.mkdir(exist_ok=True)
    os.environ["EVOTRAINER_CACHE"] = str(path)
    return path


@pytest.fixture(scope="session")
def tiny_policy(cache_dir, tmp_path_factory) -> Path:
    """A warm tiny policy, built through the real child-process warm-up path (once per run: a worker that needs it
    while another builds it waits for that one)."""
    from evotrainer.trainer import jobs
    from evotrainer.trainer.policy import ModelConfig, WarmupConfig

    return jobs.warm_policy("math", 0, tmp_path_factory.mktemp("warmup-work"), model_cfg=ModelConfig(**TINY_MODEL),
                            warm_cfg=WarmupConfig(**TINY_WARMUP))  # warm_policy's own lock: one worker builds it


def run_cli(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run the real `evotrainer` command line in a child process."""
    return subprocess.run([sys.executable, "-m", "evotrainer.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=cwd, timeout=900)


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def chat_completion(content: str, *, model: str = "m", prompt_tokens: int = 10, completion_tokens: int = 10) -> bytes:
    """The body of an OpenAI chat-completions reply carrying `content` (for the local test servers)."""
    return json.dumps({"id": "chatcmpl-test", "object": "chat.completion", "created": int(time.time()),
                       "model": model, "choices": [{"index": 0, "finish_reason": "stop",
                                                    "message": {"role": "assistant", "content": content}}],
                       "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                 "total_tokens": prompt_tokens + completion_tokens}}).encode()


@contextmanager
def local_server(handler) -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 answering with `handler` (an `http.server` handler class) in a thread:
    yields its OpenAI-style base URL (`http://127.0.0.1:PORT/v1`)."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    finally:
        srv.shutdown()
        srv.server_close()


def send_json(handler, data: bytes, status: int = 200) -> None:
    """Answer a request of an `http.server` handler with a JSON body."""
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


@pytest.fixture
def scripted_llm() -> Iterator[str]:
    """A meta-LLM of one's own: `test_llm_path.ScriptedOpenAI` (each agent's scripted replies) on a local server,
    its call counts and received schemas reset; yields the base URL for --api-base."""
    from .test_llm_path import ScriptedOpenAI

    ScriptedOpenAI.calls, ScriptedOpenAI.formats = {}, {}
    with local_server(ScriptedOpenAI) as url:
        yield url
