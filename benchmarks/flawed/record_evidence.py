"""Record the evidence of a short real training run under a flawed harness, for tests/test_flawed.py.

    python benchmarks/flawed/record_evidence.py code/low_lr [code/short_limit ...] [--steps 5]

Trains `evotrainer train --harness benchmarks/flawed/<domain>/<name> --steps N --seed 0` from the domain's cached warm
policy (built on a miss) in a scratch folder, and keeps its evidence (`g0/main`: rollouts and steps, Parquet) under
`tests/data/flawed/<domain>-<name>/` with `source.json`: the harness's content digest, the steps, the seed, the
command. The test reruns every analyzer and the offline Planner on that evidence, and refuses it once the harness's
digest differs (the evidence is then of another harness: record it again). Used for every harness but `make demo`'s
(`math/answer_line_everywhere`, which the test trains): for the domains whose warm policy the package does not ship
training in the test would first cost a warm-up, and each training child costs the suite about 30 s.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from evotrainer.base.settings import apply_offline_switches

ROOT = Path(__file__).resolve().parents[2]
FLAWED = ROOT / "benchmarks" / "flawed"
DATA = ROOT / "tests" / "data" / "flawed"


def record(name: str, steps: int, seed: int = 0) -> Path:
    from evotrainer.workspaces.source import starting_harness

    harness = FLAWED / name
    start = starting_harness(None, harness)
    dest = DATA / name.replace("/", "-")
    with tempfile.TemporaryDirectory(dir=Path.home()) as tmp:  # under ~: the sandbox hides /tmp
        out = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "evotrainer.cli", "train", "--domain", start.domain, "--harness", str(harness),
               "--steps", str(steps), "--seed", str(seed), "--eval-k", "0", "--eval-limit", "1", "--out", str(out),
               "--json"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"error: training under {harness} failed:\n{proc.stderr[-2000:]}")
        shutil.rmtree(dest, ignore_errors=True)
        (dest / "evidence").mkdir(parents=True)
        shutil.copytree(out / "evidence" / "g0", dest / "evidence" / "g0")
    (dest / "source.json").write_text(json.dumps({
        "harness": f"benchmarks/flawed/{name}", "digest": start.digest, "steps": steps, "seed": seed,
        "command": f"python benchmarks/flawed/record_evidence.py {name} --steps {steps}"}, indent=1) + "\n")
    return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="+", help="<domain>/<name> under benchmarks/flawed/")
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    apply_offline_switches()
    for name in args.names:
        print(f"{name}: {record(name, args.steps)}")


if __name__ == "__main__":
    main()
