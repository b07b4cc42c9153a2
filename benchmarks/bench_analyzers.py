"""Replay throughput: built-in analyzers over stored rollouts, and a candidate's rewards replayed in the sandbox.

    python benchmarks/bench_analyzers.py [--rollouts 200000] [--replay-rollouts 10000]

Writes synthetic but realistic evidence (math train prompts, groups of 8, completions right, wrong,
unformatted or looping) through the real EvidenceWriter, then measures
1. every built-in analyzer over it (`run_all`, reading excluded and included): rollouts per second;
2. a replay of the math template's reward functions over `--replay-rollouts` rollouts through the real
   sandboxed child (`run_replay`), child start included: seconds.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from evotrainer.base.settings import apply_offline_switches
from evotrainer.trainer.backtest import run_replay
from evotrainer.trainer.diagnostics import REGISTRY, run_all
from evotrainer.trainer.domains import get_domain
from evotrainer.trainer.evidence import EvidenceWriter, read_rollouts, read_steps
from evotrainer.trainer.harness import load_spec
from evotrainer.workspaces import TEMPLATES

GROUP, PER_STEP = 8, 256


def write_evidence(root: Path, n: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    tasks = get_domain("math").tasks("train", n // GROUP + 1, seed=seed)
    w = EvidenceWriter(root, 0, "main")
    rows = []
    for i in range(n):
        t = tasks[i // GROUP]
        step, kind = 1 + i // PER_STEP, rng.random()
        if kind < 0.45:
            completion = t.target
        elif kind < 0.85:
            completion = t.target[:-1] + str((int(t.target[-1]) + 1) % 10) if t.target[-1].isdigit() else "7"
        elif kind < 0.95:
            completion = "the answer"
        else:
            completion = "12" * 8
        correct = completion == t.target
        fmt_ok = completion not in ("the answer", "12" * 8)
        rows.append({
            "rollout_id": f"bench/g0/main/{step}:{(i % PER_STEP) // GROUP}:{i % GROUP}", "run": "bench",
            "generation": 0, "branch": "main", "harness_commit": "", "checkpoint": "c", "step": step,
            "prompt_id": t.id, "group_id": f"{step}:{(i % PER_STEP) // GROUP}", "sample_idx": i % GROUP,
            "difficulty": t.difficulty, "prompt": t.prompt, "completion": completion,
            "completion_ids": [ord(c) % 64 for c in completion],
            "task": json.dumps({"answer": t.answer, "difficulty": t.difficulty, "fmt": t.fmt}),
            "n_tokens": len(completion) + 1, "truncated": bool(rng.random() < 0.03), "reward": float(correct) + 0.1 *
            fmt_ok, "advantage": 0.0, "loss_masked": False, "correct": correct, "formatted": fmt_ok,
            "mean_logprob": float(-0.3 - rng.random()), "reward_correctness": float(correct),
            "reward_answer_format": float(fmt_ok)})
        if (i + 1) % PER_STEP == 0:
            w.add_step({"step": step, "reward": 0.5, "grad_norm": 0.1 + 0.01 * rng.random(), "kl": 0.0,
                        "clip_ratio": 0.01})
        if (i + 1) % (PER_STEP * 25) == 0 or i == n - 1:
            w.add_rollouts(rows)
            rows = []
            w.flush(step)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rollouts", type=int, default=200_000)
    ap.add_argument("--replay-rollouts", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    apply_offline_switches()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "evidence"
        t = time.time()
        write_evidence(root, args.rollouts)
        print(f"wrote {args.rollouts} rollouts in {time.time() - t:.1f} s")
        t = time.time()
        df, steps = read_rollouts(root).to_pandas(), read_steps(root).to_pandas()
        read_s = time.time() - t
        best = float("inf")
        for _ in range(args.repeats):
            t = time.time()
            findings = run_all(df, steps)
            best = min(best, time.time() - t)
        print(f"{len(REGISTRY)} built-in analyzers over {len(df)} rollouts: {best:.2f} s = "
              f"{len(df) / best:,.0f} rollouts/s ({len(df) / (best + read_s):,.0f}/s with the {read_s:.2f} s read); "
              f"{len(findings)} findings")
        for a in REGISTRY.values():
            t = time.time()
            a.run(df, steps)
            print(f"  {a.id:28s} {time.time() - t:6.3f} s")

        small = Path(tmp) / "small"
        write_evidence(small, args.replay_rollouts, seed=1)
        work = Path(tmp) / "work"
        t = time.time()
        res = run_replay(TEMPLATES / "math", small, 0, ["main"], load_spec(TEMPLATES / "math").analyzers, work,
                         "replay benchmark")
        print(f"replay of the math template's rewards over {res.n_rollouts} rollouts: {time.time() - t:.2f} s "
              f"end to end (child start included; {res.seconds:.2f} s inside the child)")


if __name__ == "__main__":
    main()
