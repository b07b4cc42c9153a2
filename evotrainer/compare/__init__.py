"""`evotrainer compare`: EvoTrainer against static human-engineered recipes and its own ablations, from the same warm
policy, with the same seeds, scored by the same sealed test split (DESIGN §5, §7).

Arms
  reference     the domain's template harness, never evolved, trained for as many main-line steps as the EvoTrainer
                champion line of the same seed (the template already is DAPO-style: token-level loss, clip-higher)
  clip_higher   GRPO's own sequence-level loss with the clip-higher upper bound
  dr_grpo       Dr. GRPO: no per-group std scaling, its length-unbiased loss
  zero_var      the reference plus zero-variance-group filtering (the template's `drop_dead_groups`)
  hpo           a hyperparameter search over the template's recipe (Optuna TPE), at the EvoTrainer arm's GRPO steps of
                the same seed, chosen on sealed dev (hpo.py)
  evotrainer    the co-evolution loop with the offline meta-policy
  no_revision, no_memory, replay_only   the loop with one part switched off (diagnostics revision, skill memory,
                short-run backtests)
  evotrainer_llm  the loop with its agents played by the meta-LLM `--meta-llm` names (default `local`), everything
                else as `evotrainer`: a model measured against the offline policy with one command (only with --arms)

Every (arm, seed) is a cell whose result is written to DIR/cells/ when it is done: an interrupted comparison rerun with
the same command resumes at the first missing cell (a loop arm resumes its own run from its graph checkpoint), and
several processes running the same command share the cells (a file lock per cell). The
report (compare.json, results.md, accuracy_vs_compute.png, lineage.png) is rebuilt from the cells.

Compute is counted as GRPO steps (backtest arms included) and CPU seconds of this process and its children.
A promotion is invalid when the policy it hands on scores significantly lower on the sealed test than what the main
line would have been without it, the generation's control arm of the same start, seed and steps (the paired 95%
interval lies below zero; a replay-only promotion: the next generation's training against the champion it replaced).

The package: `arms.py` (what each arm is, the budgets), `hpo.py` (the search arm), `execution.py` (cells run and
resumed, the request checked), `results.py` (cells and the paired statistics over them), `report.py` (compare.json,
results.md, plots).
"""

from evotrainer.compare.arms import (
    ARMS,
    BUDGETS,
    DEFAULT_ARMS,
    DOMAINS,
    LLM_ARMS,
    LOOPS,
    STATIC,
    CompareBudget,
    line_steps,
    static_harness,
)
from evotrainer.compare.execution import Compare, check_request, compare
from evotrainer.compare.report import headline, markdown, write_report
from evotrainer.compare.results import ArmSummary, Cell, Comparison, summarize

__all__ = ["ARMS", "BUDGETS", "DEFAULT_ARMS", "DOMAINS", "LLM_ARMS", "LOOPS", "STATIC", "ArmSummary", "Cell", "Compare",
           "CompareBudget", "Comparison", "check_request", "compare", "headline", "line_steps", "markdown",
           "static_harness", "summarize", "write_report"]
