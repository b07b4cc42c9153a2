"""Skill memory query latency: k=5 on a store of 10,000 skills, MiniLM and hashing embeddings.

    python benchmarks/bench_memory.py [--skills 10000] [--queries 50] [--embedding minilm hashing]

Builds a fresh persistent store of N skills (the 42 corpus triggers of tests/data/skill_corpus.json,
varied with other numbers, difficulty levels and domains so no two are alike), then times `query`
for the corpus's paraphrased diagnoses: the text alone, the text with its analyzer ids (the Planner's
query) and with the retrieval recorded (a metadata write per hit), in a process that already loaded
the model. Prints median and 95th percentile in milliseconds, and the build time.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

from evotrainer.base.settings import apply_offline_switches
from evotrainer.memory.skill import Skill, Trigger, Validation
from evotrainer.memory.store import SkillStore

CORPUS = json.loads((Path(__file__).parent.parent / "tests" / "data" / "skill_corpus.json").read_text())
DOMAINS = ["math", "code", "swe"]


def synthetic(n: int, seed: int = 0) -> list[Skill]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        s = CORPUS["skills"][i % len(CORPUS["skills"])]
        text = (f"{s['trigger']} Seen in {rng.randint(5, 95)}% of rollouts at difficulty {rng.randint(1, 5)}, "
                f"generation {rng.randint(1, 40)}.")
        eff = rng.gauss(0.0, 0.02)
        out.append(Skill(trigger=Trigger(text=text, analyzers=s["analyzers"]), factor=s["factor"],
                         intervention=s["change"],
                         validations=[Validation(domain=rng.choice(DOMAINS), verdict="promote" if eff > 0.02
                                                 else "reject", effect=eff, ci_low=eff - 0.02, ci_high=eff + 0.02,
                                                 seeds=2, steps=30)]).recompute())
    return out


def timed(fn, queries: list[dict]) -> tuple[float, float]:
    ms = []
    for q in queries:
        t = time.perf_counter()
        fn(q)
        ms.append(1000 * (time.perf_counter() - t))
    ms.sort()
    return statistics.median(ms), ms[int(0.95 * (len(ms) - 1))]


def measure(emb: str, skills: list[Skill], queries: list[dict]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = SkillStore(Path(tmp) / "store", embedding=emb)
        t = time.perf_counter()
        store.put(skills)
        build = time.perf_counter() - t
        store.query("warm-up", k=5, record=False)
        text = timed(lambda q: store.query(q["text"], k=5, record=False), queries)
        sig = timed(lambda q: store.query(q["text"], k=5, analyzers=q["analyzers"], record=False), queries)
        rec = timed(lambda q: store.query(q["text"], k=5, analyzers=q["analyzers"]), queries)
        filt = timed(lambda q: store.query(q["text"], k=5, domain="code", outcome="positive", record=False), queries)
        print(f"{emb:8s} {len(store)} skills built in {build:.0f} s; k=5 query median / p95 ms: text "
              f"{text[0]:.1f} / {text[1]:.1f}, text+analyzers {sig[0]:.1f} / {sig[1]:.1f}, recorded "
              f"{rec[0]:.1f} / {rec[1]:.1f}, filtered (domain, outcome) {filt[0]:.1f} / {filt[1]:.1f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skills", type=int, default=10_000)
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--embedding", nargs="*", default=["minilm", "hashing"])
    args = ap.parse_args()
    apply_offline_switches()
    skills = synthetic(args.skills)
    queries = (CORPUS["queries"] * (args.queries // len(CORPUS["queries"]) + 1))[:args.queries]
    for emb in args.embedding:
        measure(emb, skills, queries)

if __name__ == "__main__":
    main()
