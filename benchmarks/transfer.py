"""Cross-domain transfer through skill memory (issue #28): loop runs on math, then code, then swe sharing one skill
store, and the same runs each with an empty store; then `evotrainer analyze` over all of them.

    python benchmarks/transfer.py [--out ~/evotrainer-transfer] [--generations 3] [--candidates 2] [--seed 0]
                                  [--domains math,code,swe] [--part all|shared|empty] [--smoke]

- `OUT/shared/<domain>`: the domains in order, every run with `--skills OUT/shared/skills`, so each later run
  retrieves what the earlier ones stored (and adds its own);
- `OUT/empty/<domain>`: the same run with its own store, empty at its start. The first domain's shared run is that
  run already (its store is empty at its start, the seed is the same), so it is not trained twice.

Every run is an `evotrainer run` directory: rerunning the command resumes an interrupted run (`evotrainer resume`) and
skips a finished one. At the end, `OUT/analysis/` holds `evotrainer analyze` over all runs (the skills table's
cross-domain column: lessons retrieved across domains, what the candidate did), and `OUT/transfer.md` adds what
analyze cannot see from one run: the skills of the shared store that became general (positive in two or more
domains), and per domain the candidates tried before the first promotion with the shared store and with an empty one.
`--part shared` / `--part empty` runs one half only, so the two halves can run at once in two processes (each loop run
trains its backtest arms two at a time, so the two halves share the cores four ways); the analysis is written by the
call that finds every run finished (rerun without `--part` to write it).
`--smoke` shrinks every run (1 generation, 1 candidate, 2-step segments, 100 dev items) to check the pipeline.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ["--train-steps", "2", "--backtest-steps", "2", "--seeds", "1", "--max-seeds", "1", "--dev-items", "100"]


def cli(*args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "evotrainer.cli", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"evotrainer {' '.join(args[:2])} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def finished(path: Path) -> bool:
    summary = path / "reports" / "summary.json"
    return summary.is_file() and bool(json.loads(summary.read_text()).get("finished"))


def run(path: Path, domain: str, skills: Path, args: argparse.Namespace) -> dict:
    """One loop run, started, resumed or read back when finished."""
    if finished(path):
        return json.loads((path / "reports" / "summary.json").read_text())
    if (path / "run.yaml").is_file():
        return cli("resume", str(path), "--json")
    extra = SMOKE if args.smoke else []
    return cli("run", str(path), "--domain", domain, "--generations", str(args.generations), "--candidates",
               str(args.candidates), "--seed", str(args.seed), "--skills", str(skills), *extra, "--json")


def first_plan(path: Path) -> str:
    plan = path / "reports" / "plan-g1.json"
    if not plan.is_file():
        return "no plan"
    return ", ".join(f"`{iv.get('transform') or iv['factor']}`" for iv in json.loads(plan.read_text())["interventions"])


def prior_lines(runs: dict[tuple[str, str], Path], domains: list[str], skills: list) -> list[str]:
    """What crossed domains without being retrieved: the Planner ranks every catalog change by its expected gain under
    memory's prior, and the Critic judges under it, from every measurement of that change in any domain (retrieval
    of whole skills is limited to the run's domain and to general skills). Per later domain of the shared store:
    each candidate's change with the measurements of it the earlier domains left, and the first plan with the shared
    store against the first plan with an empty one."""
    from evotrainer.analyze import read_facts

    out = ["## Through the prior", "",
           "Retrieval hands the Planner whole skills of the run's own domain and general ones only; what every "
           "domain's runs measured of a change reaches later runs of any domain as the prior its expected gain is "
           "ranked by and the Critic judges under. Measurements of each candidate's change left by the earlier "
           "domains (effect, verdict), and the first generation's plan with the shared and with an empty store:", "",
           "| domain | candidate | change | measured before in other domains | its outcome |", "|---|---|---|---|---|"]
    firsts = []
    for i, domain in enumerate(domains[1:], start=1):
        facts = read_facts(runs[("shared", domain)])
        for c in facts.candidates:
            before = [v for s in skills if c.transform and s.transform == c.transform for v in s.validations
                      if v.domain in domains[:i]]
            said = "; ".join(f"{v.domain} {v.verdict} {v.effect:+.3f}" if v.effect is not None
                             else f"{v.domain} {v.verdict}" for v in before) or "nothing"
            effect = "" if c.effect is None else f" {c.effect:+.3f}"
            out.append(f"| {domain} | `{c.branch}` | {c.transform or c.factor} | {said} | {c.status}{effect} |")
        firsts.append(f"| {domain} | {first_plan(runs[('shared', domain)])} | {first_plan(runs[('empty', domain)])} |")
    out += ["", "| domain | first plan, shared store | first plan, empty store |", "|---|---|---|", *firsts, ""]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path.home() / "evotrainer-transfer")
    ap.add_argument("--generations", type=int, default=3)
    ap.add_argument("--candidates", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--domains", default="math,code,swe")
    ap.add_argument("--part", choices=["all", "shared", "empty"], default="all",
                    help="run one half only (the other may run at once in a second process)")
    ap.add_argument("--smoke", action="store_true", help="tiny runs: check the pipeline, measure nothing")
    args = ap.parse_args()
    if args.smoke:
        args.generations, args.candidates = 1, 1
    domains = args.domains.split(",")
    out = args.out.expanduser().resolve()
    runs: dict[tuple[str, str], Path] = {}
    for domain in domains:  # shared: in order, one store
        runs[("shared", domain)] = out / "shared" / domain
        if args.part != "empty":
            print(f"shared store: {domain}", flush=True)
            run(runs[("shared", domain)], domain, out / "shared" / "skills", args)
    runs[("empty", domains[0])] = runs[("shared", domains[0])]  # the same inputs: an empty store, the same seed
    for domain in domains[1:]:  # empty: each its own store
        runs[("empty", domain)] = out / "empty" / domain
        if args.part != "shared":
            print(f"empty store: {domain}", flush=True)
            run(runs[("empty", domain)], domain, out / "empty" / f"skills-{domain}", args)
    if not all(finished(path) for path in runs.values()):
        print(f"{args.part}: done; the other half is still running, the analysis waits for it", flush=True)
        return

    every = [str(p) for p in dict.fromkeys(runs.values())]  # the first domain's run once
    proc = subprocess.run([sys.executable, "-m", "evotrainer.cli", "analyze", *every, "--out", str(out / "analysis")],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"evotrainer analyze failed:\n{proc.stderr[-3000:]}")

    from evotrainer.analyze import first_promotion, read_facts
    from evotrainer.memory.store import SkillStore

    lines = ["# Cross-domain transfer through skill memory", "",
             f"`python benchmarks/transfer.py --out {args.out} --generations {args.generations} --candidates "
             f"{args.candidates} --seed {args.seed} --domains {args.domains}{' --smoke' if args.smoke else ''}`; "
             "the trajectory analyses of all runs: [analysis/analysis.md](analysis/analysis.md). The first domain's "
             "run with the shared store is also its run with an empty one (the store is empty when it starts).", "",
             "| domain | shared store: candidates | informed by a skill | from another domain | to the first promotion "
             "| empty store: candidates | to the first promotion |", "|---|---|---|---|---|---|---|"]
    for domain in domains:
        shared, empty = read_facts(runs[("shared", domain)]), read_facts(runs[("empty", domain)])
        cross = sum(any(s.domains and domain not in s.domains for s in c.skills) for c in shared.candidates)
        lines.append(f"| {domain} | {len(shared.candidates)} | {sum(bool(c.skills) for c in shared.candidates)} | "
                     f"{cross} | {first_promotion(shared) or 'none promoted'} | {len(empty.candidates)} | "
                     f"{first_promotion(empty) or 'none promoted'} |")
    store = SkillStore(out / "shared" / "skills")
    skills = store.list() if (out / "shared" / "skills").is_dir() else []
    general = [s for s in skills if s.general]
    lines += ["", f"The shared store holds {len(skills)} skills; general (positive in two or more domains): "
              + (", ".join(f"`{s.id}` {s.transform or s.factor} ({', '.join(s.domains)}, {s.effect:+.3f})"
                           for s in general) if general else "none") + ".", ""]
    lines += prior_lines(runs, domains, skills)
    (out / "transfer.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
