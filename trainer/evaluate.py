"""Sealed evaluation: greedy accuracy and avg@k of a checkpoint on dev or test (DESIGN §5).

Runs in its own process (`python -m evotrainer.trainer.evaluate SPEC.json`), imports only the
package's domain code, never a harness, and refuses to run when the domain's scorer fingerprint
differs from the one recorded in `trainer/domains/sealed.json` (or from the one the caller
expects). Greedy decoding with fixed batching is deterministic: the same checkpoint scores the same.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from pydantic import BaseModel

from evotrainer.base.errors import UserError

SEALED_FILE = Path(__file__).parent / "domains" / "sealed.json"


class EvalSpec(BaseModel):
    checkpoint: str
    domain: str
    split: str = "dev"
    k: int = 4  # samples per item for avg@k
    temperature: float = 1.0
    limit: int | None = None  # first n items only (tests)
    seed: int = 0
    expected_fingerprint: str | None = None
    result_path: str


class EvalResult(BaseModel):
    checkpoint: str
    domain: str
    split: str
    n_items: int
    accuracy: float  # greedy
    avg_at_k: float  # mean correctness of k samples at `temperature`
    pass_at_k: float
    k: int
    temperature: float
    by_difficulty: dict[str, float]
    fingerprint: str
    seconds: float
    item_ids: list[str]
    greedy_correct: list[bool]  # per item, for paired comparisons
    sampled_correct: list[int]  # per item: how many of k samples were correct


class SealedError(UserError):
    """The sealed scorer or its data changed: no evaluation or promotion may use it."""


def check_sealed(domain, expected: str | None = None) -> str:
    """The domain's fingerprint, after checking it against the recorded one (and `expected`)."""
    from evotrainer.trainer.domains import fingerprint

    fp = fingerprint(domain)
    recorded = json.loads(SEALED_FILE.read_text()).get(domain.name) if SEALED_FILE.is_file() else None
    for name, want in (("recorded in trainer/domains/sealed.json", recorded), ("expected by this run", expected)):
        if want is not None and want != fp:
            raise SealedError(f"the sealed scorer of domain {domain.name!r} changed (fingerprint {fp}, {name}: "
                              f"{want}); restore the domain's code and data before evaluating")
    return fp


def evaluate(spec: EvalSpec) -> EvalResult:
    import torch

    from evotrainer.trainer.domains import get_domain, grade_all
    from evotrainer.trainer.policy import format_prompts, generate, load_policy

    torch.set_num_threads(1)
    started = time.time()
    domain = get_domain(spec.domain)
    fp = check_sealed(domain, spec.expected_fingerprint)
    tasks = domain.tasks(spec.split, spec.limit)
    model, tokenizer = load_policy(spec.checkpoint)
    prompts = [t.prompt for t in tasks]
    context = getattr(model.config, "max_position_embeddings", None)
    if getattr(domain, "multi_turn", False):  # episodes in the sealed environment, whatever a harness offered
        from evotrainer.trainer.episodes import play

        env = domain.sealed_env
        if context is not None and env.max_context > context:
            raise UserError(f"{spec.domain} episodes need {env.max_context} positions but this policy has {context}: "
                            f"evaluate a policy built for the {spec.domain} domain (its default has {env.max_context})")

        def complete(items: list, temperature: float = 0.0, batch_size: int = 256) -> list[str]:
            return play(model, tokenizer, items, env, temperature=temperature, seed=spec.seed, keep_cache=True)
    else:
        budget = getattr(domain, "split_max_new_tokens", {}).get(spec.split, domain.max_new_tokens)
        shown = dict(zip((t.id for t in tasks), format_prompts(tokenizer, prompts)))  # what the policy is given
        longest = max(len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in shown.values())
        if context is not None and longest + budget > context:
            raise UserError(f"the {spec.split} prompts need {longest + budget} positions (longest prompt {longest} + "
                            f"{budget} new tokens) but this policy has {context}: evaluate a larger model "
                            "(a local Hugging Face checkpoint), or grade its completions with --completions FILE")

        def complete(items: list, temperature: float = 0.0, batch_size: int = 256) -> list[str]:
            return generate(model, tokenizer, [shown[t.id] for t in items], budget, temperature=temperature,
                            seed=spec.seed, batch_size=batch_size)
    greedy = complete(tasks)
    greedy_ok = [g.correct for g in grade_all(domain, greedy, [t.answer for t in tasks], [t.fmt for t in tasks],
                                              prompts)]
    sampled_ok = [0] * len(tasks)
    if spec.k > 0:
        rep = [t for t in tasks for _ in range(spec.k)]
        sampled = complete(rep, spec.temperature, 512)
        grades = grade_all(domain, sampled, [t.answer for t in rep], [t.fmt for t in rep], [t.prompt for t in rep])
        for i in range(len(tasks)):
            sampled_ok[i] = sum(g.correct for g in grades[i * spec.k:(i + 1) * spec.k])
    by_diff: dict[str, list[bool]] = {}
    for ok, t in zip(greedy_ok, tasks):
        by_diff.setdefault(str(t.difficulty), []).append(ok)
    n = len(tasks)
    return EvalResult(
        checkpoint=spec.checkpoint, domain=spec.domain, split=spec.split, n_items=n,
        accuracy=sum(greedy_ok) / n, avg_at_k=sum(sampled_ok) / (n * spec.k) if spec.k else 0.0,
        pass_at_k=sum(c > 0 for c in sampled_ok) / n if spec.k else 0.0, k=spec.k, temperature=spec.temperature,
        by_difficulty={d: sum(v) / len(v) for d, v in sorted(by_diff.items())}, fingerprint=fp,
        seconds=round(time.time() - started, 2), item_ids=[t.id for t in tasks], greedy_correct=greedy_ok,
        sampled_correct=sampled_ok,
    )


if __name__ == "__main__":  # `python -m evotrainer.trainer.evaluate SPEC.json` (jobs.evaluate)
    from evotrainer.trainer.sandbox import serve_spec

    serve_spec(EvalSpec, evaluate)
