"""Is a shipped warm policy what the warm-up builds? Rebuild each policy of `trainer/policies/` from its
configuration in a scratch cache and compare.

    python benchmarks/shipped_policy.py [--only math-s0-...] [--work ~/.cache/evotrainer/shipped-check]

For each shipped key whose configuration is the default of its domain (the only ones `cached_policy` ever finds),
the warm-up runs in a child exactly as on a cache miss (`EVOTRAINER_NO_SHIPPED=1`, all cores), then prints whether
the weights are identical (their sha256, `weights_digest`), the largest absolute weight difference otherwise, the SFT
steps of each, and the wall time of the rebuild.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from evotrainer.base.settings import apply_offline_switches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="")
    ap.add_argument("--work", type=Path, default=Path.home() / ".cache" / "evotrainer" / "shipped-check")
    args = ap.parse_args()
    apply_offline_switches()
    os.environ["EVOTRAINER_CACHE"] = str(args.work / "cache")
    os.environ["EVOTRAINER_NO_SHIPPED"] = "1"
    from evotrainer.trainer import jobs
    from evotrainer.trainer.policy import SHIPPED, cache_key, default_configs, weights_digest

    for shipped in sorted(p for p in SHIPPED.iterdir() if (p / "meta.json").is_file()):
        if args.only and shipped.name != args.only:
            continue
        meta = json.loads((shipped / "meta.json").read_text())
        model_cfg, warm_cfg = default_configs(meta["domain"])
        if cache_key(meta["domain"], meta["seed"], model_cfg, warm_cfg) != shipped.name:
            print(f"{shipped.name}: not the default configuration's key any more (stale: rebuild and ship it again)")
            continue
        started = time.time()
        built = jobs.warm_policy(meta["domain"], meta["seed"], args.work / "work")
        seconds = time.time() - started
        a, b = shipped / "model.safetensors", built / "model.safetensors"
        da, db = weights_digest(shipped), weights_digest(built)
        same = da == db
        line = f"{shipped.name}: rebuilt in {seconds:.0f} s; weights {'identical' if same else 'differ'} " \
               f"(sha256 {da} shipped, {db} rebuilt); SFT steps {meta['steps']} shipped, " \
               f"{json.loads((built / 'meta.json').read_text())['steps']} rebuilt"
        if not same:
            from safetensors.numpy import load_file

            x, y = load_file(str(a)), load_file(str(b))
            line += f"; largest weight difference {max(float(abs(x[k] - y[k]).max()) for k in x):.2e}"
        print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
