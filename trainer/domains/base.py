"""What every domain provides: a task source with disjoint splits and a sealed scorer.

The sealed side (DESIGN §5) is owned here and never by a harness: the scorer decides whether
a completion is correct, grades every training rollout into the evidence column `correct`, and
grades dev and test. Its fingerprint (a hash of the domain's source code and of its generated
data) is re-checked before every evaluation, so a changed scorer cannot silently move a score.
"""

from __future__ import annotations

import hashlib
import inspect
from dataclasses import asdict, dataclass, field
from typing import Protocol

SPLITS = ("train", "dev", "test")


@dataclass(frozen=True)
class Task:
    """One prompt of a domain. `answer` and `fmt` are sealed: rewards may read them, never change them."""

    id: str
    prompt: str
    answer: str
    difficulty: int
    fmt: str  # how the final answer must be written (domain-specific, read by the sealed scorer)
    target: str  # a correct completion, used only for the SFT warm-up
    columns: tuple[tuple[str, str], ...] = ()  # extra dataset columns (the code domain's visible examples)

    def row(self, sealed: tuple[str, ...] = ()) -> dict:
        """The dataset row handed to TRL: every column reaches the reward functions, except `sealed` ones."""
        d = asdict(self)
        d["prompt_id"] = d.pop("id")
        d.pop("target")
        d.update(d.pop("columns"))
        for name in sealed:
            d.pop(name, None)
        return d


@dataclass
class Grade:
    """The sealed scorer's verdict on one completion, plus domain-specific evidence columns."""

    correct: bool
    formatted: bool  # the sealed parser could read a final answer (a program, for code)
    columns: dict = field(default_factory=dict)


class Domain(Protocol):
    name: str
    max_new_tokens: int  # generation budget of sealed evaluation

    def tasks(self, split: str, n: int | None = None, seed: int = 0) -> list[Task]:
        """Deterministic tasks of a split; train may be sampled with any seed, dev/test are fixed."""

    def score(self, completion: str, answer: str, fmt: str) -> bool:
        """The sealed scorer: is the completion's final answer correct."""

    def parse(self, completion: str, fmt: str) -> str | None:
        """The final answer as the sealed scorer reads it, or None when it cannot be read."""


def grade_all(domain: Domain, completions: list[str], answers: list[str], fmts: list[str],
              prompts: list[str] | None = None) -> list[Grade]:
    """The sealed grades of many completions at once: a domain that runs programs grades them in one batch
    (its `grade`), the others one by one with `score` and `parse`."""
    if hasattr(domain, "grade"):
        return domain.grade(completions, answers, fmts, prompts)
    return [Grade(domain.score(c, a, f), domain.parse(c, f) is not None) for c, a, f in zip(completions, answers, fmts)]


def prompt_hash(prompt: str) -> int:
    """Stable hash of a normalised prompt: splits are assigned by it, so they are disjoint by construction."""
    norm = " ".join(prompt.lower().split())
    return int.from_bytes(hashlib.blake2b(norm.encode(), digest_size=8).digest(), "big")


def split_of(prompt: str) -> str:
    """The split a prompt belongs to, by its hash: 15% dev, 15% test, 70% train (disjoint by construction)."""
    bucket = prompt_hash(prompt) % 20
    return "dev" if bucket < 3 else "test" if bucket < 6 else "train"


def fingerprint(domain: Domain) -> str:
    """Hash of the domain's code and of its dev/test data: changes when the sealed side changes."""
    h = hashlib.blake2b(digest_size=16)
    h.update(inspect.getsource(inspect.getmodule(type(domain))).encode())
    h.update(inspect.getsource(inspect.getmodule(Task)).encode())
    for module in getattr(domain, "sealed_sources", ()):  # other modules the scorer runs (the SWE environment)
        h.update(inspect.getsource(module).encode())
    for split in ("dev", "test", *getattr(domain, "extra_splits", ())):
        for t in domain.tasks(split):
            h.update(f"{t.id}\x00{t.prompt}\x00{t.answer}\x00{t.fmt}\n".encode())
    return h.hexdigest()


def data_fingerprint(domain: Domain) -> str:
    """Hash of the tasks alone (dev, test and a train sample): names what a policy was warmed up on, so a
    comment edit in the domain's code does not throw away cached policies."""
    h = hashlib.blake2b(digest_size=16)
    for split, n in (("dev", None), ("test", None), ("train", 2000)):
        for t in domain.tasks(split, n, seed=0):
            h.update(f"{t.id}\x00{t.prompt}\x00{t.answer}\x00{t.fmt}\x00{t.target}\n".encode())
    return h.hexdigest()
