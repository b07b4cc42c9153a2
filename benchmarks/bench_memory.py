"""Skill memory query latency on a store of 10,000 skills: in the process that built it, on the store reopened,
and end to end through the command line (`evotrainer skills query`), for MiniLM and hashing embeddings.

    python benchmarks/bench_memory.py [--skills 10000] [--queries 50] [--cli 5] [--embedding minilm hashing]
                                      [--keep DIR]

Builds a persistent store of N skills (the 42 corpus triggers of tests/data/skill_corpus.json, varied with other
numbers, difficulty levels and domains so no two are alike; `--keep DIR` keeps it in DIR/<embedding> and reuses it
on the next call), then times k=5 queries with the corpus's paraphrased diagnoses:
- built: the handle that wrote the store: the text alone, the text with its analyzer ids (the Planner's query),
  with the retrieval recorded (a metadata write per hit), and filtered by domain and outcome;
- reopened: a new handle on the same folder in this process (what a resumed run or a second run does): its
  first query (reading the model's weights included), then the text and the text with analyzer ids;
- command line: `evotrainer skills query TEXT --skills DIR --json` in a new process, wall time end to end
  (interpreter start, imports, opening the store, the model, one query, the output), `--cli` times.
Prints median and 95th percentile in milliseconds (seconds for the command line), and the build time.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
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


def cli_seconds(path: Path, queries: list[dict], runs: int) -> list[float]:
    """Wall time of `evotrainer skills query` in a fresh process, per run."""
    script = Path(sys.executable).with_name("evotrainer")
    cmd = [str(script)] if script.exists() else [sys.executable, "-c", "from evotrainer.cli import main; main()"]
    out = []
    for q in (queries * runs)[:runs]:
        t = time.perf_counter()
        res = subprocess.run([*cmd, "skills", "query", q["text"], "--k", "5", "--skills", str(path), "--json"],
                             capture_output=True, text=True)
        out.append(time.perf_counter() - t)
        if res.returncode != 0 or not json.loads(res.stdout):
            raise SystemExit(f"skills query failed: {res.stderr.strip()[-500:]}")
    return out


def measure(emb: str, path: Path, n: int, queries: list[dict], cli_runs: int) -> None:
    store = SkillStore(path, embedding=emb)
    built = ""
    if len(store) != n:
        if len(store):
            shutil.rmtree(path)
            store = SkillStore(path, embedding=emb)
        t = time.perf_counter()
        store.put(synthetic(n))
        built = f"built in {time.perf_counter() - t:.0f} s; "
    store.query("warm-up", k=5, record=False)
    text = timed(lambda q: store.query(q["text"], k=5, record=False), queries)
    sig = timed(lambda q: store.query(q["text"], k=5, analyzers=q["analyzers"], record=False), queries)
    rec = timed(lambda q: store.query(q["text"], k=5, analyzers=q["analyzers"]), queries)
    filt = timed(lambda q: store.query(q["text"], k=5, domain="code", outcome="positive", record=False), queries)
    print(f"{emb:8s} {len(store)} skills, {built}k=5 query median / p95 ms: text {text[0]:.1f} / {text[1]:.1f}, "
          f"text+analyzers {sig[0]:.1f} / {sig[1]:.1f}, recorded {rec[0]:.1f} / {rec[1]:.1f}, filtered (domain, "
          f"outcome) {filt[0]:.1f} / {filt[1]:.1f}", flush=True)
    t = time.perf_counter()
    reopened = SkillStore(path)
    reopened.query(queries[0]["text"], k=5, record=False)
    first = 1000 * (time.perf_counter() - t)
    text = timed(lambda q: reopened.query(q["text"], k=5, record=False), queries)
    sig = timed(lambda q: reopened.query(q["text"], k=5, analyzers=q["analyzers"], record=False), queries)
    print(f"{emb:8s} reopened in this process: open + first query {first:.0f} ms; then median / p95 ms: text "
          f"{text[0]:.1f} / {text[1]:.1f}, text+analyzers {sig[0]:.1f} / {sig[1]:.1f}", flush=True)
    if cli_runs:
        s = sorted(cli_seconds(path, queries, cli_runs))
        print(f"{emb:8s} `evotrainer skills query` end to end, {len(s)} runs: median {statistics.median(s):.2f} s, "
              f"max {s[-1]:.2f} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skills", type=int, default=10_000)
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--cli", type=int, default=5, help="command-line runs per embedding (0: none)")
    ap.add_argument("--embedding", nargs="*", default=["minilm", "hashing"])
    ap.add_argument("--keep", type=Path, help="keep the stores in this folder and reuse them")
    args = ap.parse_args()
    apply_offline_switches()
    queries = (CORPUS["queries"] * (args.queries // len(CORPUS["queries"]) + 1))[:args.queries]
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        for emb in args.embedding:
            measure(emb, root / emb, args.skills, queries, args.cli)


if __name__ == "__main__":
    main()
