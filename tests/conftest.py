"""Shared fixtures: offline switches, a private policy cache, and a tiny warm policy built once per session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evotrainer.base.settings import apply_offline_switches

apply_offline_switches()

# a policy small enough that warm-up and a few GRPO steps take seconds: tests check mechanics, not accuracy
TINY_MODEL = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64, "max_positions": 160}
TINY_WARMUP = {"target_accuracy": 0.99, "max_steps": 150, "eval_every": 150, "eval_items": 50}


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("policy-cache")
    os.environ["EVOTRAINER_CACHE"] = str(path)
    return path


@pytest.fixture(scope="session")
def tiny_policy(cache_dir, tmp_path_factory) -> Path:
    """A warm tiny policy, built through the real child-process warm-up path."""
    from evotrainer.trainer import jobs
    from evotrainer.trainer.policy import ModelConfig, WarmupConfig

    work = tmp_path_factory.mktemp("warmup-work")
    return jobs.warm_policy("math", 0, work, model_cfg=ModelConfig(**TINY_MODEL), warm_cfg=WarmupConfig(**TINY_WARMUP))


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


def send_json(handler, data: bytes, status: int = 200) -> None:
    """Answer a request of an `http.server` handler with a JSON body."""
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
