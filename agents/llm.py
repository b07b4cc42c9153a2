"""The one meta-LLM client (DESIGN §8): LiteLLM, any provider string, structured output with one repair round.

- Provider strings as LiteLLM takes them (`openai/...`, `anthropic/...`, `ollama/...`, `hosted_vllm/...` with
  `api_base`); keys from the providers' usual environment variables.
- One retry layer, ours: a call makes at most `retries` attempts, each cut off after `timeout_s` seconds of wall
  clock (a server that trickles bytes cannot stretch it). LiteLLM's and the OpenAI SDK's own retries are off, so
  the two never multiply. Only transient failures are retried (timeouts, connection errors, 408/409/429/5xx, a
  reply over `MAX_REPLY_CHARS`); a bad key or an unknown model fails at once.
- `structured(agent, system, user, Model)` takes the reply's JSON object (found by one linear scan), validates it
  with pydantic, and on failure sends the validation error back once (the repair round) before giving up with
  `LLMError`.
- Tokens and dollars are counted per agent; every prompt and reply is appended to
  `<run>/transcripts/<agent>.jsonl`, and each call's cost is reported through `on_call` (the loop writes it to
  events.jsonl, so that spend survives a restart).
- `preflight()` makes one tiny call: an unreachable endpoint or a missing key is one clear `UserError` before
  any training starts.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from evotrainer.base.errors import UserError

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # never fetch the price list at import

M = TypeVar("M", bound=BaseModel)
TIMEOUT_S = 120.0  # wall clock of one attempt
ATTEMPTS = 2  # attempts per call (`retries`): 1 is no retry
MAX_REPLY_CHARS = 256 * 1024  # a longer reply is a failed attempt: no agent's answer is that long
MAX_CANDIDATES = 8  # JSON objects of one reply tried against the schema


class LLMError(UserError):
    """The meta-LLM failed to give a usable answer (after the repair round) or could not be reached."""


class Usage(BaseModel):
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    dollars: float = 0.0


_TOKEN = re.compile(r'\\.|["{}]', flags=re.S)  # an escape (taken whole), a quote or a brace


def _json_objects(text: str) -> list[str]:
    """The outermost balanced `{...}` spans of a reply, in order, found in one linear pass: prose or a ```json
    fence around the object does not matter, braces inside JSON strings are skipped, and a stray `{` that never
    closes does not hide an object after it."""
    opens: list[int] = []
    spans: list[tuple[int, int]] = []
    in_string = False
    for m in _TOKEN.finditer(text):
        tok = m.group()
        if in_string:
            in_string = tok != '"'
        elif tok == '"':
            in_string = bool(opens)  # a quote in prose, outside any brace, opens no string
        elif tok == "{":
            opens.append(m.start())
        elif tok == "}" and opens:
            start = opens.pop()
            while spans and spans[-1][0] > start:  # the spans it encloses are not outermost
                spans.pop()
            spans.append((start, m.end()))
    return [text[a:b] for a, b in spans]


def _transient(e: Exception) -> bool:
    """Worth another attempt: no answer in time, a dropped connection, a busy or failing server, a runaway reply."""
    code = getattr(e, "status_code", None)
    return not isinstance(code, int) or code in (408, 409, 429) or code >= 500


def _litellm():
    """LiteLLM, with its stdout hints ("Provider List", "Give Feedback") off: `--json` stdout stays pure JSON."""
    import litellm

    litellm.suppress_debug_info = True
    return litellm


class LLMClient:
    def __init__(self, model: str, api_base: str | None = None, *, transcripts: Path | None = None,
                 timeout_s: float = TIMEOUT_S, retries: int = ATTEMPTS, max_tokens: int = 4096,
                 cost_per_mtok: tuple[float, float] | None = None, schema_format: bool = False,
                 api_key: str | None = None, on_call: Callable[[str, dict], None] | None = None):
        self.model, self.api_base, self.transcripts = model, api_base, transcripts
        self.api_key = api_key  # None: the provider's environment variable
        self.schema_format = schema_format  # send each structured call's JSON schema as `response_format`
        self.timeout_s, self.retries, self.max_tokens = timeout_s, retries, max_tokens
        self.cost_per_mtok = cost_per_mtok  # (input, output) dollars per million tokens, for custom models
        self.on_call = on_call
        self.usage: dict[str, Usage] = {}

    @property
    def dollars(self) -> float:
        return sum(u.dollars for u in self.usage.values())

    def _where(self) -> str:
        return f"{self.model}" + (f" at {self.api_base}" if self.api_base else "")

    def check_environment(self) -> None:
        """A missing provider key is named before any call (endpoints given by api_base may need none)."""
        if self.api_base:
            return
        env = _litellm().validate_environment(self.model)
        if not env.get("keys_in_environment", True) and env.get("missing_keys"):
            raise UserError(f"meta-LLM {self.model} needs {', '.join(env['missing_keys'])} in the environment: set "
                            "it, pass --api-base for a local server, or use --meta-llm offline")

    def _attempt(self, messages: list[dict], schema: dict | None = None) -> tuple[object, str]:
        """One request, abandoned after `timeout_s` of wall clock (the SDK's own timeout is per read, so a server
        that trickles bytes would outlast it); the abandoned daemon thread ends with its connection. With
        `schema_format`, a structured call sends its schema as `response_format` (a server that constrains decoding
        to it, such as `--meta-llm local`, then always answers with a parseable object)."""
        litellm = _litellm()
        box: dict = {}
        extra = {"response_format": {"type": "json_schema", "json_schema": {
            "name": schema.get("title", "reply"), "schema": schema, "strict": False}}} \
            if self.schema_format and schema is not None else {}
        if self.api_key:
            extra["api_key"] = self.api_key

        def call() -> None:
            try:
                box["resp"] = litellm.completion(model=self.model, messages=messages, api_base=self.api_base,
                                                 timeout=self.timeout_s, num_retries=0, max_retries=0,
                                                 max_tokens=self.max_tokens, temperature=0.0, **extra)
            except Exception as e:  # handed to the caller's thread
                box["error"] = e

        worker = threading.Thread(target=call, name="meta-llm-call", daemon=True)
        worker.start()
        worker.join(self.timeout_s)
        if worker.is_alive():
            raise TimeoutError(f"no complete reply within {self.timeout_s:g} s")
        if "error" in box:
            raise box["error"]
        resp = box["resp"]
        choices = getattr(resp, "choices", None)  # a 200 with a non-JSON body comes back as a plain string
        content = choices[0].message.content if choices else None
        if not isinstance(content, str):
            raise ValueError(f"the reply is no chat completion with text content (got {type(resp).__name__})")
        if len(content) > MAX_REPLY_CHARS:
            raise ValueError(f"a reply of {len(content)} characters, over the {MAX_REPLY_CHARS} allowed")
        return resp, content

    def _complete(self, agent: str, messages: list[dict], schema: dict | None = None) -> str:
        started = time.time()
        attempts = max(1, self.retries)
        for attempt in range(1, attempts + 1):
            try:
                resp, content = self._attempt(messages, schema)
                break
            except Exception as e:  # every provider failure becomes one line naming the endpoint and the way out
                first = " ".join(str(e).split())[:300]
                if attempt < attempts and _transient(e):
                    if self.on_call:
                        self.on_call(agent, {"kind": "retry", "agent": agent, "attempt": attempt,
                                             "error": f"{type(e).__name__}: {first}"})
                    continue
                tries = f"{attempt} attempt{'s' if attempt > 1 else ''} of at most {self.timeout_s:g} s"
                raise LLMError(f"meta-LLM {self._where()} failed after {tries} ({type(e).__name__}: {first}): check "
                               "the model name, the endpoint and the key, raise --llm-timeout, or use --meta-llm "
                               "offline") from e
        u = getattr(resp, "usage", None)
        pt, ct = int(getattr(u, "prompt_tokens", 0) or 0), int(getattr(u, "completion_tokens", 0) or 0)
        dollars = self._cost(resp, pt, ct)
        use = self.usage.setdefault(agent, Usage())
        use.calls += 1
        use.prompt_tokens += pt
        use.completion_tokens += ct
        use.dollars += dollars
        record = {"kind": "call", "agent": agent, "model": self.model, "prompt_tokens": pt, "completion_tokens": ct,
                  "dollars": round(dollars, 6), "seconds": round(time.time() - started, 2)}
        if self.transcripts:
            self.transcripts.mkdir(parents=True, exist_ok=True)
            with open(self.transcripts / f"{agent}.jsonl", "a") as f:
                f.write(json.dumps({**record, "messages": messages, "reply": content}) + "\n")
        if self.on_call:
            self.on_call(agent, record)
        return content

    def _cost(self, resp, prompt_tokens: int, completion_tokens: int) -> float:
        if self.cost_per_mtok:
            return (prompt_tokens * self.cost_per_mtok[0] + completion_tokens * self.cost_per_mtok[1]) / 1e6
        try:
            return float(_litellm().completion_cost(completion_response=resp) or 0.0)
        except Exception:  # a model without a known price: tokens are still counted
            return 0.0

    def preflight(self) -> None:
        self.check_environment()
        reply = self._complete("preflight", [{"role": "user", "content": "Reply with the single word OK."}])
        if not reply.strip():
            raise LLMError(f"meta-LLM {self._where()} answered the preflight with an empty reply")

    def structured(self, agent: str, system: str, user: str, schema: type[M],
                   json_schema: dict | None = None) -> tuple[M, int]:
        """A `schema` instance from the model's JSON reply, and the number of attempts it took (1 or 2).
        `json_schema` (default: the model's) is what a `schema_format` request sends: a narrower one may name the
        values this call allows (the files an edit may touch); the reply is validated by `schema` either way."""
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        sent = json_schema or schema.model_json_schema()
        error = ""
        for attempt in (1, 2):
            reply = self._complete(agent, messages, sent)
            first = None
            for text in _json_objects(reply)[:MAX_CANDIDATES] or [reply]:  # the first object that validates
                try:
                    return schema.model_validate_json(text), attempt
                except ValidationError as e:
                    first = first or e.errors()[0]
            error = f"{'.'.join(str(x) for x in first['loc']) or 'reply'}: {first['msg']}"
            if self.on_call:
                self.on_call(agent, {"kind": "repair", "agent": agent, "attempt": attempt, "stage": "schema",
                                     "error": error})
            messages = messages + [
                {"role": "assistant", "content": reply},
                {"role": "user", "content": f"Your reply is not a valid {schema.__name__}: {error}. Reply again with "
                                            "only one JSON object that matches the schema, no prose."}]
        raise LLMError(f"meta-LLM {self._where()} gave no valid {schema.__name__} for the {agent} after a repair "
                       f"round: {error}")
