"""The arms of a comparison: static recipes (the template with a few `harness.yaml` keys set) and loop arms
(`LoopConfig` switches), and the budgets a comparison runs them under."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pydantic import BaseModel, Field

from evotrainer.base.errors import UserError
from evotrainer.workspaces.source import StartingHarness

STATIC: dict[str, dict[str, object]] = {  # harness.yaml keys changed from the template
    "reference": {},
    # clip-higher only binds when a batch is reused: with one update per batch the ratio is 1 (README: the loop)
    "clip_higher": {"loss_type": "grpo", "epsilon_high": 0.28, "num_iterations": 2},
    "dr_grpo": {"loss_type": "dr_grpo", "scale_rewards": "none"},
    "zero_var": {"group_filters": ["drop_dead_groups"]},
}
LOOPS: dict[str, dict[str, bool]] = {  # LoopConfig switches
    "evotrainer": {},
    "no_revision": {"revise_diagnostics": False},
    "no_memory": {"skill_memory": False},
    "replay_only": {"short_runs": False},
    "evotrainer_llm": {},  # the loop as `evotrainer`, its agents the meta-LLM `compare --meta-llm` names
}
LLM_ARMS = ("evotrainer_llm",)  # loop arms driven by the meta-LLM instead of the offline policy
SEARCHES = ("hpo",)  # hyperparameter search over the template's recipe at the EvoTrainer arm's compute (hpo.py)
ARMS = ("evotrainer", *STATIC, *SEARCHES, *[a for a in LOOPS if a != "evotrainer"])
DEFAULT_ARMS = tuple(a for a in ARMS if a not in LLM_ARMS)  # without --arms: no meta-LLM is started
DOMAINS = ("math", "code", "swe")


class CompareBudget(BaseModel):
    """What each loop arm may spend (the static arms follow the EvoTrainer champion line)."""

    generations: int = Field(3, ge=1)
    candidates: int = Field(1, ge=1)
    train_steps: int | None = Field(None, ge=1, description="champion steps per generation (None: the loop default)")
    backtest_steps: int | None = Field(None, ge=1)
    short_seeds: int | None = Field(None, ge=1, description="seeds of a short run's first round")
    max_seeds: int | None = Field(None, ge=1)
    dev_items: int | None = Field(None, ge=1)
    test_items: int | None = Field(None, ge=1, description="sealed test items (None: the whole split)")
    k: int = Field(4, ge=0, description="samples per test item for avg@k")
    hpo_trial_steps: int | None = Field(None, ge=1, description="GRPO steps of each trial of the hpo arm (None: "
                                                                "the loop's champion steps per generation)")

    def loop_overrides(self) -> dict:
        """The `LoopConfig` settings this budget fixes (the rest: the loop's defaults for the domain)."""
        backtest = {k: v for k, v in dict(steps=self.backtest_steps, seeds=self.short_seeds, max_seeds=self.max_seeds,
                                          dev_items=self.dev_items).items() if v is not None}
        return {**({"train_steps": self.train_steps} if self.train_steps else {}),
                **({"backtest": backtest} if backtest else {})}


BUDGETS = {
    # a main line of 60 GRPO steps a seed (3 generations of 20; each promotion adds its 20-step arm, the reference
    # trains as many) at about 2.3x the reference's steps: one candidate a generation on one seed, its 20-step arms
    # as long as a generation's segment, so the control's arm is the next segment (shared, not paid twice), judged
    # on the whole dev split (2,000 math items, 1,000 code) for power; the hpo arm gets the same total
    "default": CompareBudget(generations=3, candidates=1, train_steps=20, backtest_steps=20, short_seeds=1,
                             max_seeds=1, dev_items=2000),
    "smoke": CompareBudget(generations=1, candidates=1, train_steps=2, backtest_steps=2, short_seeds=1, max_seeds=1,
                    dev_items=40, test_items=60, k=2),
}


# per domain, what a budget's sealed test costs: an SWE test item is an episode played against its repository (400 of
# them, ~0.3 s each), so its test is the resolve rate of one greedy and one sampled episode (avg@1), not avg@4
DOMAIN_BUDGET: dict[str, dict[str, object]] = {"swe": {"k": 1}}


def budget_for(name: str, domain: str) -> CompareBudget:
    """The budget `name` as the comparison of `domain` runs it."""
    budget = BUDGETS[name]
    over = {k: v for k, v in DOMAIN_BUDGET.get(domain, {}).items() if k != "k" or budget.k > v}
    return budget.model_copy(update=over)


def line_steps(checkpoint: Path, since: Path | None = None) -> int:
    """GRPO steps from `since` (default: the warm policy) to `checkpoint`, summed along the parents recorded in each
    meta.json."""
    steps, seen = 0, set()
    path, stop = Path(checkpoint).resolve(), Path(since).resolve() if since else None
    while (path / "meta.json").is_file() and path not in seen and path != stop:
        seen.add(path)
        meta = json.loads((path / "meta.json").read_text())
        if "parent" not in meta:
            break  # a warm policy (or a user's model): the line starts here
        steps += int(meta.get("steps", 0))
        path = Path(meta["parent"]).resolve()
    return steps


def static_harness(base: StartingHarness, arm: str, dest: Path) -> Path:
    """The starting harness with the static arm's keys set (`STATIC`)."""
    return recipe_harness(base, STATIC[arm], dest, f"the {arm} arm")


def recipe_harness(base: StartingHarness, keys: dict[str, object], dest: Path, label: str) -> Path:
    """The starting harness with `keys` set (a list is a top-level `harness.yaml` list, a scalar a trainer knob),
    comments kept; validated like any harness. Made once: an existing `dest` is returned as it is."""
    from evotrainer.agents.offline.edits import EditError, set_knob, set_list

    if dest.is_dir():
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    base.copy_to(tmp)  # its files only: a README stays outside (workspaces/source.py)
    text = (tmp / "harness.yaml").read_text()
    for key, value in keys.items():
        try:  # a knob the harness leaves at TRL's default gets its own line
            text = set_list(text, key, value) if isinstance(value, list) else set_knob(text, key, value)
        except EditError as e:
            raise UserError(f"{label} cannot be built from {base.label}: {e}") from e
    changed = "".join(f", {k}={'[' + ', '.join(v) + ']' if isinstance(v, list) else v}" for k, v in keys.items())
    (tmp / "harness.yaml").write_text(f"# evotrainer compare: {label} ({base.label}{changed})\n" + text)
    from evotrainer.trainer import jobs

    problems = jobs.validate_harness(tmp, tmp.parent, label=label)
    if problems:
        raise UserError(f"{label}'s harness is invalid: {problems[0]}")
    tmp.rename(dest)
    return dest
