"""Does skill memory shape later search? Two runs on the same domain, same seed and budget: one with the skill
store an earlier run left, one with an empty store. For each: the first generation's plan and what the store
said about each proposed transform, the candidates tried before the first promotion, and the champion's dev
accuracy per generation.

    python benchmarks/bench_skill_reuse.py --generations 3 --candidates 3            # runs the first run too
    python benchmarks/bench_skill_reuse.py --store-from /tmp/acc2-skills               # reuse an earlier run's store

Every number comes from the runs' own files (reports/plan-g1.json, `evotrainer branches --json`,
reports/summary.json); the store given by --store-from is copied, never changed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evotrainer.base.settings import apply_offline_switches
from evotrainer.memory.store import SkillStore


def evotrainer(*args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "evotrainer.cli", *args], capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"evotrainer {' '.join(args[:2])} failed: {proc.stderr.strip().splitlines()[-1]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(out: Path, skills: Path, a: argparse.Namespace) -> dict:
    started = time.time()
    extra = ["--checkpoint", a.checkpoint] if a.checkpoint else []
    summary = evotrainer("run", str(out), "--domain", a.domain, "--generations", str(a.generations), "--candidates",
                         str(a.candidates), "--skills", str(skills), "--seed", str(a.seed), *extra, "--json")
    branches = json.loads(subprocess.run([sys.executable, "-m", "evotrainer.cli", "branches", str(out), "--json"],
                                         capture_output=True, text=True, check=True).stdout)
    tried = 0
    for b in branches:  # oldest generation first
        tried += 1
        if b["status"] == "promoted":
            break
    else:
        tried = None
    plan = json.loads((out / "reports" / "plan-g1.json").read_text())
    return {"summary": summary, "first_plan": [iv["transform"] for iv in plan["interventions"]],
            "rationale": plan["rationale"], "tried_before_first_promotion": tried,
            "dev_per_generation": [h["dev_accuracy"] for h in summary["history"]], "seconds": time.time() - started}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--domain", default="math")
    p.add_argument("--generations", type=int, default=3)
    p.add_argument("--candidates", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", default=None, help="starting policy (default: the cached warm policy)")
    p.add_argument("--store-from", default=None, help="an earlier run's skill store (default: run one first)")
    p.add_argument("--out", default=None, help="where the runs go (default: a temporary directory)")
    a = p.parse_args()
    apply_offline_switches()
    root = Path(a.out or tempfile.mkdtemp(prefix="skill-reuse-"))
    root.mkdir(parents=True, exist_ok=True)
    store = root / "store-with"
    if a.store_from:
        shutil.copytree(a.store_from, store)
    else:
        print("first run (fills the store) ...", flush=True)
        run(root / "first", store, a)
    skills = {s.transform: s.outcome for s in SkillStore(store).list(domain=a.domain)}
    print(f"store: {len(skills)} transforms known: {json.dumps(skills)}", flush=True)
    results = {}
    for name, path in (("with store", store), ("empty store", root / "store-empty")):
        print(f"run {name} ...", flush=True)
        results[name] = run(root / name.replace(" ", "-"), path, a)
    print(f"\n{'':12} | {'first generation plan (store outcome)':60} | tried before 1st promotion | dev per gen")
    for name, r in results.items():
        plan = ", ".join(f"{t} ({skills.get(t, 'untried')})" for t in r["first_plan"])
        dev = " ".join("n/a" if d is None else f"{d:.3f}" for d in r["dev_per_generation"])
        print(f"{name:12} | {plan:60} | {str(r['tried_before_first_promotion'] or 'no promotion'):26} | {dev}")
    print(f"\nruns under {root}; wall time " + ", ".join(f"{n} {r['seconds']:.0f} s" for n, r in results.items()))


if __name__ == "__main__":
    main()
