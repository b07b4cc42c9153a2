"""Wall time of one loop generation's backtests on each executor: `local` with 1 and 2 arms training at once
(`loop.backtest.parallel`), and `ray` on a local Ray instance with 2 CPUs (the arms as Ray tasks); and Ray's own
cost per task (a no-op task's round trip, and the first task's, which starts a worker).

    python benchmarks/bench_executor.py --out ~/evotrainer-executor [--candidates 2 --steps 5 --seeds 2]

Each setting is one `evotrainer run` of one generation from the same warm policy, harness and seed (the same arms
train in each); the figure is the backtest node's seconds in its events.jsonl. A finished setting is read again,
not rerun. Run it on an idle machine: the settings share nothing but the cores. Writes DIR/executor.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

SETTINGS = {"local-1": ("local", 1), "local-2": ("local", 2), "ray-2": ("ray", 2)}


def cli(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "evotrainer.cli", *args], capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"evotrainer {' '.join(args[:2])} failed: {proc.stderr.strip().splitlines()[-1]}")
    return proc


def one_generation(out: Path, name: str, a: argparse.Namespace) -> dict:
    kind, parallel = SETTINGS[name]
    run = out / name
    if not (run / "reports" / "summary.json").is_file():
        if not (run / "run.yaml").is_file():  # made by init, its parallelism set, then started as configured
            cli("init", str(run), "--domain", a.domain)
            cfg = yaml.safe_load((run / "run.yaml").read_text())
            cfg["budget"].update(generations=1, candidates=a.candidates)
            cfg["skills"] = str(out / f"{name}-skills")
            cfg["loop"]["train_steps"] = a.steps
            cfg["loop"]["backtest"].update(steps=a.steps, seeds=a.seeds, max_seeds=a.seeds, parallel=parallel)
            (run / "run.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
            cli("run", str(run), "--executor", kind, "--json")
        else:
            cli("resume", str(run), "--executor", kind, "--json")
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    if [e["event"] for e in events].count("resume"):
        sys.exit(f"{run} was interrupted: its backtest time is not one sitting's; remove it and rerun")
    seconds = sum(e["seconds"] for e in events if e["event"] == "end" and e.get("node") == "backtest")
    arms = len(list((run / "backtests").glob("g1/*/*/checkpoints/policy/meta.json")))
    return {"setting": name, "executor": kind, "parallel": parallel, "backtest_seconds": round(seconds, 1),
            "arms": arms}


def _noop(x: int) -> int:
    return x


def ray_overhead(tasks: int = 50) -> dict:
    """The executor's own cost: starting its local Ray instance, its first task (a worker started), then a task's
    round trip through `RayExecutor.call`, one at a time as an arm's thread waits for its task."""
    from evotrainer.trainer import executor

    started = time.time()
    ex = executor.configure("ray")
    init = time.time() - started
    t = time.time()
    ex.call("noop", _noop, 0)
    first = time.time() - t
    t = time.time()
    for i in range(tasks):
        ex.call("noop", _noop, i)
    each = (time.time() - t) / tasks
    ex.ray.shutdown()
    return {"init_seconds": round(init, 2), "first_task_seconds": round(first, 3),
            "task_round_trip_ms": round(each * 1000, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--domain", default="math")
    ap.add_argument("--candidates", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--seeds", type=int, default=2)
    a = ap.parse_args()
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows = [one_generation(out, name, a) for name in SETTINGS]
    overhead = ray_overhead()
    result = {"cores": os.cpu_count(), "domain": a.domain, "candidates": a.candidates, "steps": a.steps,
              "seeds": a.seeds, "settings": rows, "ray": overhead}
    (out / "executor.json").write_text(json.dumps(result, indent=1))
    lines = [f"One {a.domain} generation's backtests ({a.candidates} candidates, {a.seeds} seeds x {a.steps} steps, "
             f"{os.cpu_count()} cores):", "", "| executor | arms at once | arms | backtest seconds |",
             "|---|---|---|---|"]
    lines += [f"| {r['executor']} | {r['parallel']} | {r['arms']} | {r['backtest_seconds']:.0f} |" for r in rows]
    lines += ["", f"Ray: a local instance starts in {overhead['init_seconds']:.1f} s; its first task (a worker "
                  f"started) {overhead['first_task_seconds']:.2f} s; then {overhead['task_round_trip_ms']:.1f} ms a "
                  "task, round trip"]
    (out / "executor.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
