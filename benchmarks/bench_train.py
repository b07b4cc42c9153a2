"""Overhead of EvoTrainer's training backend against a bare TRL GRPOTrainer loop.

Both arms train the same warm policy for the same steps with the same GRPOConfig, reward functions,
dataset and seed, each in a fresh child process with one torch thread, run alternately `--repeats`
times. EvoTrainer's arm is `jobs.train` as the loop calls it, with what it exists for: the child under
bubblewrap (isolation), one evidence row per rollout (per-token log-probabilities, Parquet), per-step
aggregates, resumable checkpoints every 25 steps, then in the parent the sealed grading of every
rollout and the installed checkpoint with its meta.json. The bare arm is a plain child process that
saves the model once at the end.

    python benchmarks/bench_train.py [--steps 60] [--repeats 2] [--checkpoint CKPT]

Prints one JSON object: seconds per arm (median), the ratio evotrainer/bare, steps per second, and the
cost of starting one child (a module that imports nothing heavy) plain and isolated (median of 5).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evotrainer.base.settings import apply_offline_switches
from evotrainer.trainer import jobs
from evotrainer.trainer.grpo import TrainSpec
from evotrainer.trainer.sandbox import child_env
from evotrainer.workspaces import TEMPLATES


def bare_loop(spec_path: str) -> None:
    """The reference: TRL's GRPOTrainer as a user would write it, nothing recorded."""
    import torch
    from datasets import Dataset
    from trl import GRPOTrainer

    from evotrainer.trainer.grpo import grpo_config, training_rows
    from evotrainer.trainer.harness import load_filters, load_reward_functions, load_spec
    from evotrainer.trainer.policy import load_policy

    torch.set_num_threads(1)
    spec = TrainSpec.model_validate_json(Path(spec_path).read_text())
    hspec = load_spec(spec.harness_dir)
    model, tokenizer = load_policy(spec.checkpoint)
    model.train()
    args = grpo_config(spec, hspec.trainer, [r.weight for r in hspec.rewards])
    args.save_strategy = "no"
    rows = training_rows(json.loads(Path(spec.rows_path).read_text()), load_filters(spec.harness_dir, hspec))
    trainer = GRPOTrainer(model=model, reward_funcs=load_reward_functions(spec.harness_dir, hspec), args=args,
                          train_dataset=Dataset.from_list(rows), processing_class=tokenizer)
    trainer.train()
    trainer.save_model(str(Path(spec.out_dir) / "final"))


def _timed(cmd: list[str], cwd: str) -> float:
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=child_env(), capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"benchmark arm failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--checkpoint", help="policy to train (default: the cached warm math policy)")
    ap.add_argument("--bare", help=argparse.SUPPRESS)
    a = ap.parse_args()
    apply_offline_switches()
    if a.bare:
        bare_loop(a.bare)
        return
    harness = str(TEMPLATES / "math")
    with tempfile.TemporaryDirectory(prefix="evo-bench-") as tmp:
        root = Path(tmp)
        ckpt = a.checkpoint or str(jobs.warm_policy("math", 0, root))
        times: dict[str, list[float]] = {"evotrainer": [], "bare": []}
        for r in range(a.repeats):
            for arm in ("bare", "evotrainer"):
                out = root / f"{arm}-{r}"
                spec = TrainSpec(domain="math", checkpoint=ckpt, harness_dir=harness, steps=a.steps, seed=0,
                                 out_dir=str(out), checkpoint_id="bench", checkpoints_dir=str(out / "checkpoints"),
                                 evidence_dir=str(out / "evidence"), result_path=str(out / "result.json"))
                out.mkdir(parents=True)
                if arm == "bare":
                    job = jobs.prepare_training(spec, out)  # the same rows file the isolated child reads
                    times[arm].append(_timed([sys.executable, __file__, "--bare", str(job.spec_path)], harness))
                else:
                    t = time.perf_counter()
                    jobs.train(spec, out)
                    times[arm].append(time.perf_counter() - t)
        starts = _child_starts(root)
    med = {arm: statistics.median(v) for arm, v in times.items()}
    print(json.dumps({
        "steps": a.steps, "repeats": a.repeats, "seconds": times,
        "median_seconds": {k: round(v, 2) for k, v in med.items()},
        "ratio": round(med["evotrainer"] / med["bare"], 3),
        "steps_per_second": {k: round(a.steps / v, 3) for k, v in med.items()},
        "child_start_seconds": starts,
    }, indent=2))


def _child_starts(root: Path, n: int = 5) -> dict[str, float]:
    """Median wall time of starting a child that imports the package's settings and exits, plain and isolated."""
    from evotrainer.trainer.sandbox import Isolation, Limits, run_module

    out = {}
    for name, iso in (("plain", None), ("isolated", Isolation(write=[str(root / "start")]))):
        seconds = []
        for _ in range(n):
            t = time.perf_counter()
            res = run_module("evotrainer.base.settings", [], cwd=root, log_path=root / "start.log",
                             limits=Limits(timeout_s=60), isolation=iso)
            seconds.append(time.perf_counter() - t)
            if not res.ok:
                sys.exit(f"child start failed: {res.message}")
        out[name] = round(statistics.median(seconds), 3)
    return out


if __name__ == "__main__":
    main()
