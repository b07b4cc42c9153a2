"""How a meta-LLM answers the loop's agents: per agent, the share of structured replies valid on the first try and
after the repair round, tokens and seconds per call. Runs the loop with `--meta-llm local` (SmolLM2-135M on
127.0.0.1) on each domain, or reads runs given with --runs (any meta-LLM: the table is the same).

    python benchmarks/bench_meta_llm.py --out ~/evotrainer-meta-llm                 # math and code, 2 x 3 each
    python benchmarks/bench_meta_llm.py --runs RUN [RUN...] --out DIR               # runs made by other means

Every number comes from the runs' events.jsonl: a `call` event per answered request (tokens, wall seconds), a
`repair` event with `stage: schema` when a reply did not validate (attempt 1: the repair round follows; attempt 2:
the call failed). Implemented or not, each candidate's fate is from the run's summary. A run that exists and
finished is read again, not rerun. Writes DIR/meta-llm.json and DIR/meta-llm.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

AGENTS = ("preflight", "diagnoser", "planner", "coder", "critic")


def loop_run(out: Path, domain: str, a: argparse.Namespace) -> Path:
    run = out / f"{domain}-local"
    summary = run / "reports" / "summary.json"
    if summary.is_file() and json.loads(summary.read_text()).get("finished"):
        return run
    verb = "resume" if (run / "run.yaml").is_file() else "run"
    args = [str(run), "--json"] if verb == "resume" else [
        str(run), "--domain", domain, "--generations", str(a.generations), "--candidates", str(a.candidates),
        "--meta-llm", a.meta_llm, "--skills", str(out / f"{domain}-skills"), "--train-steps", "4",
        "--backtest-steps", "4", "--seeds", "1", "--max-seeds", "1", "--dev-items", "50", "--json"]
    proc = subprocess.run([sys.executable, "-m", "evotrainer.cli", verb, *args], capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"evotrainer {verb} {run} failed: {proc.stderr.strip().splitlines()[-1]}")
    return run


def measure(runs: list[Path]) -> dict:
    per: dict[str, dict] = defaultdict(lambda: {"calls": 0, "repair_1": 0, "repair_2": 0, "prompt_tokens": 0,
                                                "completion_tokens": 0, "seconds": 0.0, "max_seconds": 0.0})
    fates: dict[str, int] = defaultdict(int)
    models = set()
    for run in runs:
        for line in (run / "events.jsonl").read_text().splitlines():
            e = json.loads(line)
            if e["event"] == "run_start":
                models.add(e.get("meta_policy", "?"))
            if e["event"] == "call":
                p = per[e["agent"]]
                p["calls"] += 1
                p["prompt_tokens"] += e["prompt_tokens"]
                p["completion_tokens"] += e["completion_tokens"]
                p["seconds"] += e["seconds"]
                p["max_seconds"] = max(p["max_seconds"], e["seconds"])
            elif e["event"] == "repair" and e.get("stage") == "schema":
                per[e["agent"]][f"repair_{e['attempt']}"] += 1
            elif e["event"] == "decision" and e.get("node") == "critique":
                implemented = not any(r.startswith("not implemented") for r in e.get("reasons", []))
                fates[f"{e['decision']}" if implemented else "not implemented"] += 1
            elif e["event"] == "critic_fallback":
                fates["critic fell back to the rule"] += 1
    rows = {}
    for agent in sorted(per, key=lambda x: AGENTS.index(x) if x in AGENTS else 99):
        p = per[agent]
        asked = p["calls"] - p["repair_1"]  # structured requests: a repair round is a second call of the same
        rows[agent] = {**p, "asked": asked, "valid_first": asked - p["repair_1"],
                       "valid_after_repair": p["repair_1"] - p["repair_2"], "failed": p["repair_2"],
                       "prompt_tokens_per_call": round(p["prompt_tokens"] / p["calls"], 1),
                       "completion_tokens_per_call": round(p["completion_tokens"] / p["calls"], 1),
                       "seconds_per_call": round(p["seconds"] / p["calls"], 1)}
    return {"runs": [str(r) for r in runs], "models": sorted(models), "agents": rows, "candidates": dict(fates)}


def markdown(m: dict) -> str:
    lines = [f"Meta-LLM: {', '.join(m['models'])}; runs: {', '.join(m['runs'])}", "",
             "| agent | requests | valid first try | valid after repair | failed | prompt tokens/call | "
             "reply tokens/call | seconds/call (max) |", "|---|---|---|---|---|---|---|---|"]
    for agent, r in m["agents"].items():
        n = max(r["asked"], 1)
        lines.append(f"| {agent} | {r['asked']} | {r['valid_first']} ({r['valid_first'] / n:.0%}) | "
                     f"{r['valid_after_repair']} | {r['failed']} | {r['prompt_tokens_per_call']:.0f} | "
                     f"{r['completion_tokens_per_call']:.0f} | {r['seconds_per_call']:.1f} ({r['max_seconds']:.0f}) |")
    lines += ["", "Candidates: " + ", ".join(f"{k} {v}" for k, v in sorted(m["candidates"].items()))]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--runs", type=Path, nargs="*", help="finished runs to read instead of running the loop")
    ap.add_argument("--domains", default="math,code")
    ap.add_argument("--generations", type=int, default=2)
    ap.add_argument("--candidates", type=int, default=3)
    ap.add_argument("--meta-llm", default="local")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    runs = a.runs or [loop_run(a.out.resolve(), d, a) for d in a.domains.split(",")]
    m = measure(runs)
    (a.out / "meta-llm.json").write_text(json.dumps(m, indent=1))
    (a.out / "meta-llm.md").write_text(markdown(m))
    print(markdown(m))


if __name__ == "__main__":
    main()
