"""What keeping each episode's cache between turns saves in SWE training rollouts (`episodes.CachedActor`).

    python benchmarks/bench_rollouts.py [--episodes 32] [--repeats 3] [--checkpoint DIR]

Both arms play the same batch of training episodes as one GRPO step does (32 issues of the train split, one batch,
temperature 1, the template's tools, the program sandbox for `test` actions) from the same torch seed, one torch
thread, alternately `--repeats` times: `generate` over every episode's whole text each turn (what sealed
evaluation does), and the kept cache (what training does since it was added). Prints one JSON object: seconds per
arm (median), the ratio, and the tokens of the episodes played (the arms sample differently after the first
differing floating-point sum, so their episodes are alike in kind, not identical).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from evotrainer.base.settings import apply_offline_switches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--checkpoint", type=Path, help="a SWE policy (default: the one the package ships)")
    args = ap.parse_args()
    apply_offline_switches()

    import torch

    from evotrainer.trainer import episodes, swe_env
    from evotrainer.trainer.domains import get_domain
    from evotrainer.trainer.policy import SHIPPED, load_policy

    torch.set_num_threads(1)
    model, tok = load_policy(args.checkpoint or next(SHIPPED.glob("swe-*")))
    tasks = get_domain("swe").tasks("train", args.episodes, seed=0)
    rows = [{"prompt": t.prompt, **dict(t.columns)} for t in tasks]
    config = swe_env.EnvConfig(tools=swe_env.TOOLS)
    times: dict[str, list[float]] = {"generate": [], "cache": []}
    tokens: dict[str, list[int]] = {"generate": [], "cache": []}
    for rep in range(args.repeats):
        for arm in times:
            act = episodes.model_policy(model, tok, temperature=1.0, seed=rep, batch_size=args.episodes,
                                        keep_cache=arm == "cache")
            start = time.perf_counter()
            outs = episodes.run_episodes(act, tok, rows, config)
            times[arm].append(time.perf_counter() - start)
            tokens[arm].append(sum(len(o.completion_ids) for o in outs))
    med = {arm: statistics.median(t) for arm, t in times.items()}
    print(json.dumps({"episodes": args.episodes, "repeats": args.repeats,
                      "seconds": {arm: round(m, 2) for arm, m in med.items()},
                      "cache_over_generate": round(med["cache"] / med["generate"], 3),
                      "tokens": {arm: round(statistics.mean(t)) for arm, t in tokens.items()}}))


if __name__ == "__main__":
    main()
