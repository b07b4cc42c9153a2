"""Skill retrieval quality: top-1 and top-3 on the tuning set and on the held-out set, MiniLM and hashing.

    python benchmarks/bench_retrieval.py [--embedding minilm hashing] [--sweep]

Stores the 42 skills of tests/data/skill_corpus.json in a fresh store per embedding, then asks each query as the
Planner asks (graph/nodes.py, plan: `store.query(text, k=10, domain=..., analyzers=...)`, the analyzers being the
ids of the warning and critical findings), and once without the analyzer ids ("text only": the text and the
domain filter). Two query sets:

- tuning: the corpus's own 25 paraphrases, written with the skills; SIGNATURE_WEIGHT (memory/store.py) was chosen
  on these alone (`--sweep` prints the sweep: the smallest weight at which top-1 stops rising);
- held-out: tests/data/skill_heldout.json, 40 diagnoses written as a user describes the symptoms, from the
  analyzers' docs and the skills' keys, before the skill texts were read; never used to choose anything.

A query counts as found at k when the skill it names is among the first k; "any relevant" also accepts the other
skills its `also` lists (other interventions tried in the same situation).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from evotrainer.base.settings import apply_offline_switches
from evotrainer.memory import store as store_module
from evotrainer.memory.skill import Skill, Trigger, Validation
from evotrainer.memory.store import SkillStore

DATA = Path(__file__).parent.parent / "tests" / "data"
CORPUS = json.loads((DATA / "skill_corpus.json").read_text())
HELDOUT = json.loads((DATA / "skill_heldout.json").read_text())
DOMAIN = {s["key"]: s["domain"] for s in CORPUS["skills"]}


def corpus_store(path: Path, embedding: str) -> SkillStore:
    store = SkillStore(path, embedding)
    store.put([Skill(id=s["key"], trigger=Trigger(text=s["trigger"], analyzers=s["analyzers"]), factor=s["factor"],
                     intervention=s["change"], validations=[Validation(domain=s["domain"], verdict="promote")])
               .recompute() for s in CORPUS["skills"]])
    return store


def ranks(store: SkillStore, queries: list[dict], analyzers: bool) -> list[tuple[int, int]]:
    """Per query: the rank of its skill and of the first relevant skill (1-based, 99 when not in the top 10)."""
    out = []
    for q in queries:
        ids = [h.skill.id for h in store.query(q["text"], k=10, domain=DOMAIN[q["skill"]], record=False,
                                               analyzers=q["analyzers"] if analyzers else None)]
        relevant = [i + 1 for i, s in enumerate(ids) if s in {q["skill"], *q.get("also", [])}]
        out.append((ids.index(q["skill"]) + 1 if q["skill"] in ids else 99, min(relevant, default=99)))
    return out


def row(rs: list[tuple[int, int]]) -> str:
    n = len(rs)
    meant = [sum(r <= k for r, _ in rs) / n for k in (1, 3)]
    anyr = [sum(r <= k for _, r in rs) / n for k in (1, 3)]
    return f"{meant[0]:.2f} / {meant[1]:.2f} | {anyr[0]:.2f} / {anyr[1]:.2f}"


def sweep(store: SkillStore) -> None:
    """Top-1, top-3 and mean reciprocal rank on the tuning set for a range of signature weights."""
    chosen = store_module.SIGNATURE_WEIGHT
    for w in (0.0, 0.05, 0.10, 0.15, 0.20, 0.25, 0.30, 0.40, 0.50):
        store_module.SIGNATURE_WEIGHT = w
        rs = [r for r, _ in ranks(store, CORPUS["queries"], True)]
        print(f"  weight {w:.2f}: tuning top-1 {sum(r == 1 for r in rs) / len(rs):.2f}, top-3 "
              f"{sum(r <= 3 for r in rs) / len(rs):.2f}, MRR {sum(1 / r for r in rs) / len(rs):.3f}")
    store_module.SIGNATURE_WEIGHT = chosen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--embedding", nargs="*", default=["minilm", "hashing"])
    ap.add_argument("--sweep", action="store_true", help="print the tuning set's sweep of SIGNATURE_WEIGHT")
    args = ap.parse_args()
    apply_offline_switches()
    print(f"{len(CORPUS['skills'])} skills; {len(CORPUS['queries'])} tuning and {len(HELDOUT['queries'])} held-out "
          f"queries; SIGNATURE_WEIGHT {store_module.SIGNATURE_WEIGHT:.2f}\n")
    print("| embedding | query set | query | top-1 / top-3 (the skill meant) | top-1 / top-3 (any relevant) |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for emb in args.embedding:
            store = corpus_store(Path(tmp) / emb, emb)
            for name, queries in (("tuning", CORPUS["queries"]), ("held-out", HELDOUT["queries"])):
                for label, ids in (("text only", False), ("text + analyzer ids (the Planner's)", True)):
                    print(f"| {emb} | {name} | {label} | {row(ranks(store, queries, ids))} |", flush=True)
            if args.sweep:
                print(f"\n{emb}: SIGNATURE_WEIGHT on the tuning set")
                sweep(store)
                print()


if __name__ == "__main__":
    main()
