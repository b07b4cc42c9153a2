"""The `hpo` arm: what automated RL post-training does today, a hyperparameter search over a fixed harness, at the
EvoTrainer arm's compute.

The template harness never changes; Optuna's TPE sampler searches the recipe knobs the catalog's recipe transforms
change (`space`). Trial 0 is the template's own recipe, as a practitioner's baseline is. Each trial trains the first
`trial_steps` of the main line under its recipe (same seed, same horizon as the reference: the prefix of the run it
would become) and is scored on sealed dev (greedy, the loop's dev items). The best trial on dev (ties: the earlier)
is continued from its trial's full training state to the main line's length and scored on sealed test, so the
chosen recipe is trained exactly as a fresh run of it would be (tests/test_line.py: a continued line equals an
unbroken one). Its GRPO steps are `trials x trial_steps + (main - trial_steps)`, the trial count chosen so that
this does not exceed the EvoTrainer arm's total of the same seed.

Resumable: finished trials are journalled in `trials.json`, and trial i's parameters are a function of the trials
before it alone (a sampler seeded by (seed, i) over a study rebuilt from the journal), so a rerun proposes the same
ones and a trial's checkpoint, once written, is reused.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from pydantic import BaseModel

from evotrainer.base.errors import UserError
from evotrainer.base.files import atomic_write_text, set_aside
from evotrainer.compare.arms import recipe_harness
from evotrainer.workspaces.source import StartingHarness


class Trial(BaseModel):
    number: int
    params: dict[str, object]
    dev_accuracy: float
    checkpoint: str


class Search(BaseModel):
    """What the `hpo` arm searched and chose (a cell's `hpo` record)."""

    trial_steps: int
    trials: list[Trial]
    chosen: int  # a trial number
    startup: int  # random trials before TPE models the rest

    def steps(self, main_steps: int) -> int:
        """Every GRPO step the search took: its trials, then the chosen one continued to `main_steps`."""
        return len(self.trials) * self.trial_steps + max(main_steps - self.trial_steps, 0)


def current(template: dict) -> dict:
    """The template's value of each knob of the search space (`template`: its trainer knobs with the backend's
    defaults filled in; a knob it leaves unset at TRL's default)."""
    eps = float(template.get("epsilon", 0.2))
    high = template.get("epsilon_high")
    return {"learning_rate": float(template["learning_rate"]), "loss_type": template.get("loss_type", "dapo"),
            "scale_rewards": template.get("scale_rewards", "group"),
            "epsilon_high": float(eps if high is None else high),
            "num_iterations": int(template.get("num_iterations") or 1),
            "temperature": float(template.get("temperature", 1.0)), "beta": float(template.get("beta") or 0.0),
            "num_generations": int(template["num_generations"]),
            "mask_truncated_completions": bool(template.get("mask_truncated_completions", False))}


def space(template: dict) -> dict:
    """The search space, as Optuna distributions, around the template's recipe: the knobs of the catalog's recipe
    transforms, each over the values practitioners try (the template's own always among them)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    now = current(template)

    def choices(key: str, values: list) -> CategoricalDistribution:
        return CategoricalDistribution(values if now[key] in values else [now[key], *values])

    lr, ng, bs = now["learning_rate"], now["num_generations"], int(template["per_device_train_batch_size"])
    return {
        "learning_rate": FloatDistribution(lr / 3, lr * 3, log=True),
        "loss_type": choices("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"]),
        "scale_rewards": choices("scale_rewards", ["group", "batch", "none"]),
        "epsilon_high": choices("epsilon_high", [float(template.get("epsilon", 0.2)), 0.28, 0.36]),
        "num_iterations": choices("num_iterations", [1, 2]),
        # the range practitioners try, stretched to hold the harness's own value (trial 0 is that recipe exactly)
        "temperature": FloatDistribution(min(0.7, now["temperature"]), max(1.3, now["temperature"]), step=0.1),
        "beta": choices("beta", [0.0, 0.02, 0.04]),
        "num_generations": choices("num_generations", [n for n in (ng, 2 * ng) if bs % n == 0 and n <= 32]),
        "mask_truncated_completions": choices("mask_truncated_completions", [True, False]),
    }


def template_recipe(base: StartingHarness) -> dict:
    """The starting harness's trainer knobs, the backend's defaults filled in."""
    from evotrainer.trainer.harness import TRAINER_DEFAULTS, load_spec

    return {**TRAINER_DEFAULTS, **load_spec(base.path).trainer}


def trial_count(total_steps: int, main_steps: int, trial_steps: int) -> int:
    """Trials that fit a total of `total_steps` GRPO steps: the chosen trial's steps count once, as the prefix of
    the main line."""
    return max(1, (total_steps - max(main_steps - trial_steps, 0)) // trial_steps)


def propose(dist: dict, journal: list[Trial], number: int, seed: int, startup: int, template: dict) -> dict:
    """Trial `number`'s parameters: the template's own at 0, else TPE's next point given the trials before it."""
    import optuna
    from optuna.trial import create_trial

    if number == 0:
        now = current(template)
        return {k: _as(dist[k], now[k]) for k in dist}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(seed=seed * 10_007 + number, n_startup_trials=startup,
                                             multivariate=True)
        study = optuna.create_study(direction="maximize", sampler=sampler)
        for t in journal:
            study.add_trial(create_trial(params=t.params, distributions=dist, value=t.dev_accuracy))
        params = study.ask(dist).params
    # as a person would write them in harness.yaml: three significant digits, a temperature on its grid
    return {k: (float(f"{v:.3g}") if k == "learning_rate" else round(v, 2) if isinstance(v, float) else v)
            for k, v in params.items()}


def _as(dist, value):
    """The template's value of a knob inside its distribution (a float range: clipped onto its grid)."""
    from optuna.distributions import FloatDistribution

    if isinstance(dist, FloatDistribution):
        v = min(max(float(value), dist.low), dist.high)
        if dist.step is not None:
            v = round((v - dist.low) / dist.step) * dist.step + dist.low
        return round(v, 10)
    return value


def run_search(base: StartingHarness, start: Path, work: Path, *, seed: int, total_steps: int, main_steps: int,
               trial_steps: int, horizon: int, dev_items: int | None) -> tuple[Path, Search]:
    """The search over `base`'s recipe and the chosen recipe's main line (see the module docstring): its final
    checkpoint and record."""
    from evotrainer.trainer import jobs
    from evotrainer.trainer.grpo import TrainSpec

    trial_steps = min(trial_steps, main_steps)
    n = trial_count(total_steps, main_steps, trial_steps)
    startup = max(2, n // 3)
    domain, template = base.domain, template_recipe(base)
    dist = space(template)
    path = work / "trials.json"
    journal = [Trial.model_validate(t) for t in json.loads(path.read_text())] if path.is_file() else []
    for number in range(len(journal), n):
        params = propose(dist, journal, number, seed, startup, template)
        tdir = work / f"t{number}"
        harness = recipe_harness(base, params, tdir / "harness", f"the hpo arm's trial {number}")
        ckpt = tdir / "checkpoints" / "policy"
        if not (ckpt / "meta.json").is_file():
            spec = TrainSpec(domain=domain, checkpoint=str(start), harness_dir=str(harness), steps=trial_steps,
                             seed=seed, horizon=horizon, keep_state=True, out_dir=str(tdir), checkpoint_id="policy",
                             checkpoints_dir=str(tdir / "checkpoints"), evidence_dir=str(tdir / "evidence"),
                             run=f"compare-hpo-t{number}", harness_commit=f"hpo:t{number}",
                             result_path=str(tdir / "specs" / "train.result.json"))
            jobs.train(spec, tdir)
        ev = jobs.evaluate(ckpt, domain, "dev", tdir, k=0, limit=dev_items, seed=seed)
        journal.append(Trial(number=number, params=params, dev_accuracy=ev.accuracy, checkpoint=str(ckpt)))
        atomic_write_text(path, json.dumps([t.model_dump() for t in journal], indent=1))
    best = max(journal[:n], key=lambda t: (t.dev_accuracy, -t.number))
    search = Search(trial_steps=trial_steps, trials=journal[:n], chosen=best.number, startup=startup)
    rest = main_steps - trial_steps
    if rest <= 0:
        return Path(best.checkpoint), search
    final = work / "final"
    ckpt = final / "checkpoints" / "policy"
    if (ckpt / "meta.json").is_file() and (had := json.loads((ckpt / "meta.json").read_text()).get("steps")) != rest:
        final.rename(set_aside(final, final.with_name(f"final-{had}steps")))  # continued for another main line
    if not (ckpt / "meta.json").is_file():
        harness = work / f"t{best.number}" / "harness"
        cont = jobs.continuation(best.checkpoint, harness)
        if cont["resume_state"] is None:
            raise UserError(f"the hpo arm's trial {best.number} kept no training state to continue: remove "
                            f"{work / f't{best.number}'} and rerun the same compare command")
        spec = TrainSpec(domain=domain, checkpoint=best.checkpoint, harness_dir=str(harness), steps=rest, seed=seed,
                         horizon=horizon, **cont, out_dir=str(final), checkpoint_id="policy",
                         checkpoints_dir=str(final / "checkpoints"), evidence_dir=str(final / "evidence"),
                         run="compare-hpo", harness_commit=f"hpo:t{best.number}",
                         result_path=str(final / "specs" / "train.result.json"))
        jobs.train(spec, final)
    return ckpt, search
