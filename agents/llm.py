"""The one meta-LLM client (DESIGN §8): LiteLLM, any provider string, structured output with one repair round.

- Provider strings as LiteLLM takes them (`openai/...`, `anthropic/...`, `ollama/...`, `hosted_vllm/...` with
  `api_base`); keys from the providers' usual environment variables.
- Each attempt has a timeout; transport errors are retried by the OpenAI SDK underneath (`retries`).
- `structured(agent, system, user, Model)` asks for one JSON object, validates it with pydantic, and on failure
  sends the validation error back once (the repair round) before giving up with `LLMError`.
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
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from evotrainer.errors import UserError

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # never fetch the price list at import

M = TypeVar("M", bound=BaseModel)


class LLMError(UserError):
    """The meta-LLM failed to give a usable answer (after the repair round) or could not be reached."""


class Usage(BaseModel):
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    dollars: float = 0.0


def _json_object(text: str) -> str:
    """The JSON object in a reply: fenced in ```json ... ``` or the outermost braces."""
    m = re.search(r"```(?:json)?\s*(\{.*\})\s*```", text, flags=re.S)
    if m:
        return m.group(1)
    start, end = text.find("{"), text.rfind("}")
    return text[start:end + 1] if start != -1 and end > start else text


class LLMClient:
    def __init__(self, model: str, api_base: str | None = None, *, transcripts: Path | None = None,
                 timeout_s: float = 120.0, retries: int = 2, max_tokens: int = 4096,
                 cost_per_mtok: tuple[float, float] | None = None,
                 on_call: Callable[[str, dict], None] | None = None):
        self.model, self.api_base, self.transcripts = model, api_base, transcripts
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
        import litellm

        if self.api_base:
            return
        env = litellm.validate_environment(self.model)
        if not env.get("keys_in_environment", True) and env.get("missing_keys"):
            raise UserError(f"meta-LLM {self.model} needs {', '.join(env['missing_keys'])} in the environment: set "
                            "it, pass --api-base for a local server, or use --meta-llm offline")

    def _complete(self, agent: str, messages: list[dict]) -> str:
        import litellm

        started = time.time()
        try:
            resp = litellm.completion(model=self.model, messages=messages, api_base=self.api_base,
                                      timeout=self.timeout_s, num_retries=self.retries, max_tokens=self.max_tokens,
                                      temperature=0.0)
            content = resp.choices[0].message.content
        except Exception as e:  # every provider failure becomes one line naming the endpoint and the way out
            first = " ".join(str(e).split())[:300]
            raise LLMError(f"meta-LLM {self._where()} failed ({type(e).__name__}: {first}): check the model name, "
                           "the endpoint and the key, or use --meta-llm offline") from e
        if not isinstance(content, str):
            raise LLMError(f"meta-LLM {self._where()} returned no text content (got {type(content).__name__})")
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
        import litellm

        try:
            return float(litellm.completion_cost(completion_response=resp) or 0.0)
        except Exception:  # a model without a known price: tokens are still counted
            return 0.0

    def preflight(self) -> None:
        self.check_environment()
        reply = self._complete("preflight", [{"role": "user", "content": "Reply with the single word OK."}])
        if not reply.strip():
            raise LLMError(f"meta-LLM {self._where()} answered the preflight with an empty reply")

    def structured(self, agent: str, system: str, user: str, schema: type[M]) -> tuple[M, int]:
        """A `schema` instance from the model's JSON reply, and the number of attempts it took (1 or 2)."""
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        error = ""
        for attempt in (1, 2):
            reply = self._complete(agent, messages)
            try:
                return schema.model_validate_json(_json_object(reply)), attempt
            except ValidationError as e:
                err = e.errors()[0]
                error = f"{'.'.join(str(x) for x in err['loc']) or 'reply'}: {err['msg']}"
                if self.on_call:
                    self.on_call(agent, {"kind": "repair", "agent": agent, "attempt": attempt, "error": error})
            messages = messages + [
                {"role": "assistant", "content": reply},
                {"role": "user", "content": f"Your reply is not a valid {schema.__name__}: {error}. Reply again with "
                                            "only one JSON object that matches the schema, no prose."}]
        raise LLMError(f"meta-LLM {self._where()} gave no valid {schema.__name__} for the {agent} after a repair "
                       f"round: {error}")
