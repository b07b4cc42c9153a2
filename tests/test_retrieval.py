"""Retrieval from skill memory: the embedding function built once per store handle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evotrainer.memory.embeddings import MiniLMEmbedding
from evotrainer.memory.skill import Skill, Trigger, Validation
from evotrainer.memory.store import SkillStore

DATA = Path(__file__).parent / "data"
CORPUS = json.loads((DATA / "skill_corpus.json").read_text())
HELDOUT = json.loads((DATA / "skill_heldout.json").read_text())


def skills() -> list[Skill]:
    return [Skill(id=s["key"], trigger=Trigger(text=s["trigger"], analyzers=s["analyzers"]), factor=s["factor"],
                  intervention=s["change"], validations=[Validation(domain=s["domain"], verdict="promote")]).recompute()
            for s in CORPUS["skills"]]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> SkillStore:
    s = SkillStore(tmp_path_factory.mktemp("retrieval") / "store")
    s.put(skills())
    return s


def test_a_reopened_store_builds_its_embedding_once(store, monkeypatch):
    """A store opened from disk keeps one embedding function: Chroma left to itself rebuilds it from the collection's
    configuration on every query, and MiniLM loaded its model each time (0.3 s a query)."""
    built = []
    init = MiniLMEmbedding.__init__
    monkeypatch.setattr(MiniLMEmbedding, "__init__", lambda self: (built.append(1), init(self))[1])
    reopened = SkillStore(store.path)
    for q in HELDOUT["queries"][:5]:
        assert reopened.query(q["text"], k=3, analyzers=q["analyzers"], record=False)
    assert len(built) == 1
