"""Wall time of `evotrainer compare` run again on a finished comparison (every cell on disk: nothing trains).

    python benchmarks/bench_compare_resume.py [--out DIR] [--checkpoint CKPT] [--repeats 3]

Without `--out`, first runs the smoke comparison of the tests (math, one seed, `--budget smoke`, arms reference,
evotrainer and replay_only) into a temporary folder, from `--checkpoint` or from the tests' tiny policy warmed here
(minutes); with `--out`, reruns that comparison as it was requested. Prints the first run's wall time (when it ran
here) and the median and worst wall time of the reruns: the command's start, the cells read back, the report and
its two plots rebuilt. `tests/test_compare.py` checks that a rerun trains and evaluates nothing; how long it takes is
measured here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evotrainer.base.settings import apply_offline_switches

# the tests' tiny policy (tests/conftest.py): warm-up and a few GRPO steps take seconds
TINY_MODEL = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64, "max_positions": 160}
TINY_WARMUP = {"target_accuracy": 0.99, "max_steps": 150, "eval_every": 150, "eval_items": 50}


def compare(args: list[str]) -> float:
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "evotrainer.cli", "compare", *args], capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"evotrainer compare failed:\n{proc.stderr[-2000:]}")
    return time.perf_counter() - t


def request_args(out: Path) -> list[str]:
    """The command line that reruns the comparison in `out` as it was requested."""
    req = json.loads((out / "request.json").read_text())
    args = ["--domain", req["domain"], "--seeds", str(req["seeds"]), "--budget", req["budget"],
            "--arms", ",".join(req["arms"]), "--out", str(out), "--json"]
    return args + (["--checkpoint", req["checkpoint"]] if req.get("checkpoint") else [])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="a finished comparison to rerun (default: a smoke comparison made here)")
    ap.add_argument("--checkpoint", help="the policy of the smoke comparison (default: the tests' tiny policy)")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    apply_offline_switches()
    with tempfile.TemporaryDirectory(prefix="evo-bench-") as tmp:
        first = None
        out = a.out
        if out is None:
            root = Path(tmp)
            ckpt = a.checkpoint
            if ckpt is None:
                from evotrainer.trainer import jobs
                from evotrainer.trainer.policy import ModelConfig, WarmupConfig

                os.environ["EVOTRAINER_CACHE"] = str(root / "cache")  # the tiny policy is not the user's
                ckpt = str(jobs.warm_policy("math", 0, root / "warm", model_cfg=ModelConfig(**TINY_MODEL),
                                            warm_cfg=WarmupConfig(**TINY_WARMUP)))
            out = root / "cmp"
            first = compare(["--domain", "math", "--seeds", "1", "--budget", "smoke", "--arms",
                             "reference,evotrainer,replay_only", "--checkpoint", ckpt, "--out", str(out), "--json"])
        elif not (out / "request.json").is_file():
            sys.exit(f"{out} holds no comparison (no request.json): pass the --out of a finished `evotrainer compare`")
        again = [compare(request_args(out)) for _ in range(a.repeats)]
    if first is not None:
        print(f"first run (trains every cell):  {first:.1f} s")
    print(f"rerun, nothing left to train:   median {statistics.median(again):.2f} s, worst {max(again):.2f} s "
          f"({a.repeats} runs)")


if __name__ == "__main__":
    main()
