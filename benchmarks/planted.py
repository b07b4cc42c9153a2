"""Planted scenarios on a real warm policy: do backtests catch what they must, at their default budget?

    python benchmarks/planted.py [--domain math|code] [--run-dir runs/planted] [--steps 30] [--seeds 2]

Builds a run on the domain's template with the cached warm policy as champion, then backtests real
candidate branches (DESIGN §12 says which failures show up fast).

Math:
- reward-bug:   rewards.py scores an unparsable answer as correct. Expected: train reward up, the sealed
                correct rate and dev down, the divergence gate and the replay gate fire.
- short-limit:  max_completion_length 40 -> 10. Expected: truncation critical, with the masked fraction.
- restore:      after promoting short-limit, a branch restoring 40. Expected: no truncation finding.
- null:         a harmless change (format weight 0.10 -> 0.11). Its interval shows the power of the
                default budget: the printed minimum detectable effect (MDE) of dev accuracy.
- dead-filter:  group_filters: [drop_dead_groups], replay only. Expected: every dead group dropped.

Code:
- crash-pass:   rewards.py counts a visible example on which the program raised as passed (the exception
                handler an agent's edit gets wrong). Expected: the crash rate and train reward rise while the
                hidden pass rate falls; the shaped-vs-sealed gate fires and the backtest records it.
- null:         format weight 0.10 -> 0.11, as for math.

Prints one line per scenario and writes the full results to RUN_DIR/planted.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from evotrainer.base.settings import apply_offline_switches
from evotrainer.trainer.backtest import BacktestConfig
from evotrainer.workspaces.run import RunWorkspace

SCENARIOS = {
    "math": {
        "reward-bug": {"rewards.py": ("1.0 if value is not None and value == int(expected) else 0.0",
                                      "1.0 if value is None or value == int(expected) else 0.0")},
        "short-limit": {"harness.yaml": ("max_completion_length: 40", "max_completion_length: 10")},
        "null": {"harness.yaml": ("weight: 0.1 ", "weight: 0.11")},
        "dead-filter": {"harness.yaml": ("group_filters: []", "group_filters: [drop_dead_groups]")},
    },
    "code": {
        "crash-pass": {"rewards.py": ("            out.append(0.0)\n            continue",
                                      "            out.append(1.0)\n            continue")},
        "null": {"harness.yaml": ("weight: 0.1 ", "weight: 0.11")},
    },
}
DEFAULT_ONLY = {"math": ["reward-bug", "null", "short-limit", "restore", "dead-filter"], "code": ["crash-pass"]}


def candidate(ws: RunWorkspace, generation: int, name: str, edit: dict) -> str:
    repo = ws.harness
    branch, tree = repo.create_candidate(generation, name, ws.path / "worktrees")
    files = {}
    for rel, (old, new) in edit.items():
        text = (tree / rel).read_text()
        if old not in text:
            sys.exit(f"scenario {name}: {old!r} not found in {rel}; the template changed")
        files[rel] = text.replace(old, new, 1)
    repo.write_files(tree, files)
    repo.commit(tree, name, intervention_id=name, hypothesis=f"planted scenario {name}", factor=name,
                generation=generation)
    return branch


def line(name: str, res) -> str:
    parts = [f"{name:12s}"]
    if res.short_run:
        s = res.short_run
        parts.append(f"dev {s.delta:+.3f} [{s.ci_low:+.3f}, {s.ci_high:+.3f}] MDE {s.mde:.3f} "
                     f"({len(s.seeds)} seeds x {s.steps} steps, {s.dev_items} items, {s.seconds_per_arm:.0f} s/arm, "
                     f"{s.seconds:.0f} s) train reward {s.train_reward_delta:+.3f} train correct "
                     f"{s.train_correct_delta:+.3f} stopped {s.stopped}")
        trunc = [f for f in s.findings if f.analyzer == "truncation"]
        if trunc:
            parts.append(f"truncation {trunc[0].severity} {trunc[0].value:.2f}")
        crit = [f"{f.analyzer}/{f.metric} {f.value:+.3f}" for f in s.findings
                if f.severity == "critical" and f.analyzer != "truncation"]
        if crit:
            parts.append("critical: " + ", ".join(crit))
    r = res.replay
    parts.append(f"replay: paid-incorrect {r.agreement_before.rewarded_incorrect:.3f}->"
                 f"{r.agreement_after.rewarded_incorrect:.3f} dead {r.dead_groups_before}->{r.dead_groups_after} "
                 f"dropped {r.groups_dropped} ({r.seconds:.1f} s)")
    parts.append(f"gates {res.failed_gates or 'none'}")
    return " | ".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--domain", choices=sorted(SCENARIOS), default="math")
    ap.add_argument("--run-dir", type=Path, default=None, help="default: runs/planted (math), runs/planted-code")
    # the budget the README's figures were measured with: longer than the loop's default short runs
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--max-seeds", type=int, default=4)
    ap.add_argument("--dev-items", type=int, default=None)
    ap.add_argument("--only", nargs="*", default=None, help="scenario names (default: all of the domain's)")
    args = ap.parse_args()
    args.run_dir = args.run_dir or Path("runs/planted" if args.domain == "math" else f"runs/planted-{args.domain}")
    only = args.only or DEFAULT_ONLY[args.domain]
    apply_offline_switches()
    shutil.rmtree(args.run_dir, ignore_errors=True)
    ws = RunWorkspace.create(args.run_dir, args.domain)
    cfg = BacktestConfig(steps=args.steps, seeds=args.seeds, max_seeds=args.max_seeds, dev_items=args.dev_items)
    results, started = {}, time.time()
    for name in only:
        if name == "restore":
            if "short-limit" not in results:
                continue
            ws.harness.promote(results["short-limit"]["branch"], 1, {"effect": 0.0, "note": "planted"})
            branch = candidate(ws, 2, name, {"harness.yaml": ("max_completion_length: 10",
                                                              "max_completion_length: 40")})
        else:
            branch = candidate(ws, 1, name, SCENARIOS[args.domain][name])
        res = ws.backtest(branch, cfg=cfg, replay_only=name == "dead-filter")
        results[name] = res.model_dump()
        print(line(name, res), flush=True)
    (args.run_dir / "planted.json").write_text(json.dumps(results, indent=2))
    print(f"total {time.time() - started:.0f} s; details in {args.run_dir / 'planted.json'}")


if __name__ == "__main__":
    main()
