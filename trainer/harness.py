"""The harness contract (DESIGN §4): `harness.yaml` schema and its mapping onto TRL's GRPOConfig.

Reading and checking `harness.yaml` is safe in any process (YAML is data). Importing the harness's
Python files (`rewards.py`, `filters.py`, `diagnostics/`) happens only in child processes: see
`load_reward_functions`, which the GRPO child and the sandboxed validator call.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import typing
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evotrainer.base.errors import UserError
from evotrainer.base.files import read_user_text

# The GRPOConfig knobs a harness may set (DESIGN §11), with TRL's own names and field types (null only where TRL gives
# None a meaning; tests/test_harness_spec.py checks the table against trl.GRPOConfig). A plain table: the
# orchestrator never imports TRL. Everything else (output paths, devices, logging, seeds) belongs to the backend,
# never to an agent's edit.
TRAINER_TYPES: dict[str, Any] = {
    "learning_rate": float, "lr_scheduler_type": str, "warmup_steps": float, "weight_decay": float,
    "max_grad_norm": float, "adam_beta1": float, "adam_beta2": float,
    "per_device_train_batch_size": int, "gradient_accumulation_steps": int, "steps_per_generation": int | None,
    "num_generations": int, "max_completion_length": int,
    "temperature": float, "top_p": float, "top_k": int, "min_p": float | None, "repetition_penalty": float,
    "generation_kwargs": dict | None,
    "loss_type": str, "epsilon": float, "epsilon_high": float | None, "delta": float | None, "beta": float,
    "scale_rewards": str, "multi_objective_aggregation": str, "mask_truncated_completions": bool,
    "top_entropy_quantile": float, "num_iterations": int, "importance_sampling_level": str,
}
TRAINER_KEYS = frozenset(TRAINER_TYPES)

# What training uses when a harness leaves a knob out, where it is not TRL's default (every other knob is): the GRPO
# backend trains with these, the batch check below and the offline catalog read a harness through them.
TRAINER_DEFAULTS: dict[str, Any] = {"per_device_train_batch_size": 128, "num_generations": 8,
                                    "max_completion_length": 32, "learning_rate": 1e-4}

_TYPE_NAMES = {float: "a number", int: "an integer", bool: "true or false", str: "a string", dict: "a mapping"}


def _type_problem(key: str, value: Any) -> str | None:
    """Why `value` is not a valid `trainer.<key>` (None when it is): YAML's bool is not a number, nor 8.0 an integer."""
    kinds = typing.get_args(TRAINER_TYPES[key]) or (TRAINER_TYPES[key],)
    if value is None and type(None) in kinds:
        return None
    (kind,) = [k for k in kinds if k is not type(None)]
    if isinstance(value, kind) and (kind is bool or not isinstance(value, bool)):
        return None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return None
    expected = _TYPE_NAMES[kind] + (" or null" if type(None) in kinds else "")
    hint = ""
    if kind is float and isinstance(value, str) and (m := re.fullmatch(r"([-+]?\d+)([eE][-+]?\d+)", value)):
        hint = f" (YAML 1.1 reads {value} as text: write {m[1]}.0{m[2]})"
    return f"must be {expected}, got {value!r}{hint}"


class RewardSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="a function of rewards.py with TRL's reward signature")
    weight: float = 1.0


class HarnessSpec(BaseModel):
    """`harness.yaml`: the recipe. Unknown keys are errors, so a typo never passes silently."""

    model_config = ConfigDict(extra="forbid")
    domain: str
    trainer: dict[str, Any] = Field(default_factory=dict, description="GRPOConfig knobs (TRAINER_KEYS)")
    rewards: list[RewardSpec] = Field(min_length=1)
    filters: list[str] = Field(default_factory=list, description="functions of filters.py applied to train rows")
    group_filters: list[str] = Field(default_factory=list, description="functions of filters.py that decide, per "
                                     "group of scored rollouts, whether it stays in the loss (dynamic sampling)")
    analyzers: dict[str, dict[str, float]] = Field(default_factory=dict, description="thresholds per analyzer id")
    notes: str = ""


def load_spec(harness_dir: str | Path, processes: int = 1) -> HarnessSpec:
    """Parse and check `harness.yaml`; every problem is one UserError sentence. `processes`: the data-parallel ranks
    it will train in (the batch is per rank, a step's whole batch must hold whole groups)."""
    path = Path(harness_dir) / "harness.yaml"
    if not path.is_file():
        raise UserError(f"harness {harness_dir} has no harness.yaml: pass a directory laid out as "
                        "workspaces/templates/<domain>/")
    try:
        raw = yaml.safe_load(read_user_text(path, "harness spec"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(e, "problem", None) or (str(e).splitlines() or [type(e).__name__])[0]
        raise UserError(f"{path} is not valid YAML{where}: {problem}") from e
    if not isinstance(raw, dict):
        raise UserError(f"{path} must be a mapping with keys domain, trainer, rewards (got {type(raw).__name__})")
    try:
        spec = HarnessSpec.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise UserError(f"{path}: {loc}: {err['msg']}") from e
    unknown = sorted(set(spec.trainer) - TRAINER_KEYS)
    if unknown:
        raise UserError(f"{path}: unknown trainer key {unknown[0]!r}; valid keys are {', '.join(sorted(TRAINER_KEYS))}")
    for key, value in spec.trainer.items():
        problem = _type_problem(key, value)
        if problem:
            raise UserError(f"{path}: trainer.{key} {problem}")
    knobs = {**TRAINER_DEFAULTS, **spec.trainer}
    bs, ng = knobs["per_device_train_batch_size"], knobs["num_generations"]
    if ng < 2:
        raise UserError(f"{path}: trainer.num_generations must be at least 2 (a group of one has no advantage), "
                        f"got {ng}")
    if bs * processes % ng:
        ranks = f" x {processes} ranks" if processes > 1 else ""
        raise UserError(f"{path}: trainer.per_device_train_batch_size ({bs}{ranks}) must be a multiple of "
                        f"trainer.num_generations ({ng}): it counts completions, not prompts")
    return spec


def import_file(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_reward_functions(harness_dir: str | Path, spec: HarnessSpec) -> list:
    """Import rewards.py and return its functions in the order of `spec.rewards`. Child processes only."""
    module = import_file(Path(harness_dir) / "rewards.py", "harness_rewards")
    funcs = []
    for r in spec.rewards:
        fn = getattr(module, r.name, None)
        if not callable(fn):
            public = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))]
            raise UserError(f"rewards.py has no function {r.name!r} named in harness.yaml; it defines {public}")
        funcs.append(fn)
    return funcs


def load_filters(harness_dir: str | Path, spec: HarnessSpec) -> list:
    """Import filters.py and return the named row filters (rows -> rows). Child processes only."""
    if not spec.filters:
        return []
    module = import_file(Path(harness_dir) / "filters.py", "harness_filters")
    out = []
    for name in spec.filters:
        fn = getattr(module, name, None)
        if not callable(fn):
            raise UserError(f"filters.py has no function {name!r} named in harness.yaml")
        out.append(fn)
    return out


def load_group_filters(harness_dir: str | Path, spec: HarnessSpec) -> list:
    """Import filters.py and return the named group filters (group -> keep?). Child processes only."""
    if not spec.group_filters:
        return []
    module = import_file(Path(harness_dir) / "filters.py", "harness_filters")
    out = []
    for name in spec.group_filters:
        fn = getattr(module, name, None)
        if not callable(fn):
            raise UserError(f"filters.py has no function {name!r} named in harness.yaml's group_filters")
        out.append(fn)
    return out


def load_env_config(harness_dir: str | Path, sealed: dict):
    """The tool environment a multi-turn harness trains in: `env.py`'s TOOLS, MAX_TURNS, MAX_CONTEXT and
    MAX_ACTION_TOKENS over `sealed`, the domain's sealed environment as the parent wrote it (`EnvConfig` fields;
    absent names keep it). Child processes only."""
    from evotrainer.trainer.swe_env import EnvConfig

    base = EnvConfig(**{**sealed, "tools": tuple(sealed["tools"])})
    path = Path(harness_dir) / "env.py"
    if not path.is_file():
        return base
    module = import_file(path, "harness_env")
    try:
        return EnvConfig(tools=tuple(getattr(module, "TOOLS", base.tools)),
                         max_turns=int(getattr(module, "MAX_TURNS", base.max_turns)),
                         max_context=int(getattr(module, "MAX_CONTEXT", base.max_context)),
                         max_action_tokens=int(getattr(module, "MAX_ACTION_TOKENS", base.max_action_tokens)))
    except (TypeError, ValueError) as e:
        raise UserError(f"{path}: {e}") from e


# What a group filter never sees: the sealed grades. A filter decides from what the harness itself computed.
SEALED_COLUMNS = frozenset({"correct", "formatted"})


def keep_groups(group_filters: list, groups: list[list[dict]]) -> list[bool]:
    """Whether each group of scored rollouts stays in the loss: every group filter must keep it.

    A group is a list of rollout dicts (prompt, completion, reward, reward_<name>, n_tokens, truncated,
    difficulty and the task's columns); a filter returns True to keep it. Training and replay both call this.
    """
    keep = [True] * len(groups)
    for fn in group_filters:
        for i, group in enumerate(groups):
            if keep[i]:
                verdict = fn([{k: v for k, v in row.items() if k not in SEALED_COLUMNS} for row in group])
                if not isinstance(verdict, bool):
                    raise TypeError(f"group filter {fn.__name__!r} returned {type(verdict).__name__}, not bool")
                keep[i] = verdict
    return keep


def sample_batch(domain, n: int = 12) -> dict:
    """A small real batch for checking reward functions: right, wrong, empty and unparsable completions (for a
    multi-turn domain: solved, wrongly fixed, submitted at once, and garbled episodes). Parent side: it reads
    the domain; the validation child receives it as data."""
    tasks = domain.tasks("train", n // 4, seed=0)
    if getattr(domain, "multi_turn", False):
        from evotrainer.trainer.swe_scripts import sample_episodes

        return sample_episodes(domain, tasks)
    completions, rows = [], []
    for t in tasks:
        for c in (t.target, t.target[:-1] + ("0" if t.target[-1] != "0" else "1"), "", "???"):
            completions.append(c)
            rows.append(t.row(getattr(domain, "sealed_columns", ())))
    batch = {k: [r[k] for r in rows] for k in rows[0]}
    batch["completions"] = completions
    return batch


def check_harness(harness_dir: str | Path, batch: dict, env: dict | None = None) -> list[str]:
    """Everything wrong with a harness, one line each (empty: valid), found by calling its code on `batch` (see
    `sample_batch`); `env` is the domain's sealed tool environment for multi-turn domains. Child only."""
    import math

    try:
        spec = load_spec(harness_dir)
    except UserError as e:
        return [str(e)]
    problems: list[str] = []
    try:
        if env is not None:
            load_env_config(harness_dir, env)
        funcs = load_reward_functions(harness_dir, spec)
        load_filters(harness_dir, spec)
        group_filters = load_group_filters(harness_dir, spec)
        from evotrainer.trainer.diagnostics import load_harness_analyzers

        load_harness_analyzers(harness_dir)
    except UserError as e:
        return [str(e)]
    except Exception as e:  # an import that fails is the harness's problem, reported in one line
        return [f"harness code failed to import: {type(e).__name__}: {e}"]
    n = len(batch["completions"])
    # the call TRL makes: prompts and completions by name, every other dataset column as a keyword
    columns = {k: v for k, v in batch.items() if k not in ("completions", "prompt")}
    for fn in funcs:
        try:
            out = fn(prompts=batch["prompt"], completions=batch["completions"], completion_ids=[[0]] * n,
                     trainer_state=None, log_extra=lambda *a: None, log_metric=lambda *a: None, **columns)
        except MemoryError:
            problems.append(f"reward {fn.__name__!r} exceeded the memory limit (MemoryError)")
            continue
        except Exception as e:
            problems.append(f"reward {fn.__name__!r} raised {type(e).__name__}: {e}")
            continue
        if not isinstance(out, list | tuple) or len(out) != n:
            got = len(out) if isinstance(out, list | tuple) else type(out).__name__
            problems.append(f"reward {fn.__name__!r} returned {got} values for {n} completions (one float each)")
        elif not all(isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in out):
            bad = next(x for x in out if not (isinstance(x, int | float) and math.isfinite(x)))
            problems.append(f"reward {fn.__name__!r} returned a non-finite or non-number value: {bad!r}")
    if group_filters:
        group = [{"prompt": p, "completion": c, "reward": float(i % 2), "n_tokens": len(c), "truncated": False,
                  **{k: v[i] for k, v in columns.items()}}
                 for i, (p, c) in enumerate(zip(batch["prompt"][:4], batch["completions"][:4]))]
        try:
            keep_groups(group_filters, [group, [dict(r, reward=0.0) for r in group]])
        except Exception as e:
            problems.append(f"group filter failed on a sample group: {type(e).__name__}: {e}")
    return problems


def main(argv: list[str]) -> int:
    """Child entry point: `python -m evotrainer.trainer.harness HARNESS_DIR BATCH.json RESULT.json`."""
    import json

    from evotrainer.base.files import atomic_write_text

    data = json.loads(Path(argv[1]).read_text())
    problems = check_harness(argv[0], data["batch"], data.get("env"))
    atomic_write_text(argv[2], json.dumps({"problems": problems}))  # whole: forks of harness code may write too
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
