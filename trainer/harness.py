"""The harness contract (DESIGN §4): `harness.yaml` schema and its mapping onto TRL's GRPOConfig.

Reading and checking `harness.yaml` is safe in any process (YAML is data). Importing the harness's
Python files (`rewards.py`, `filters.py`, `diagnostics/`) happens only in child processes: see
`load_reward_functions`, which the GRPO child and the sandboxed validator call.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evotrainer.errors import UserError

# The GRPOConfig knobs a harness may set (DESIGN §11), with TRL's own names. Everything else
# (output paths, devices, logging, seeds) belongs to the backend, never to an agent's edit.
TRAINER_KEYS = frozenset({
    "learning_rate", "lr_scheduler_type", "warmup_steps", "weight_decay", "max_grad_norm", "adam_beta1", "adam_beta2",
    "per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation", "num_generations",
    "max_completion_length", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "generation_kwargs",
    "loss_type", "epsilon", "epsilon_high", "delta", "beta", "scale_rewards", "multi_objective_aggregation",
    "mask_truncated_completions", "top_entropy_quantile", "num_iterations", "importance_sampling_level",
})


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
    analyzers: dict[str, dict[str, float]] = Field(default_factory=dict, description="thresholds per analyzer id")
    notes: str = ""


def load_spec(harness_dir: str | Path) -> HarnessSpec:
    """Parse and check `harness.yaml`; every problem is one UserError sentence."""
    path = Path(harness_dir) / "harness.yaml"
    if not path.is_file():
        raise UserError(f"harness {harness_dir} has no harness.yaml: pass a directory laid out as "
                        "workspaces/templates/<domain>/")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise UserError(f"{path} is not valid YAML{where}: {getattr(e, 'problem', e)}") from e
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
    bs, ng = spec.trainer.get("per_device_train_batch_size", 8), spec.trainer.get("num_generations", 8)
    if bs % ng:
        raise UserError(f"{path}: trainer.per_device_train_batch_size ({bs}) must be a multiple of "
                        f"trainer.num_generations ({ng}): it counts completions, not prompts")
    return spec


def _import_file(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_reward_functions(harness_dir: str | Path, spec: HarnessSpec) -> list:
    """Import rewards.py and return its functions in the order of `spec.rewards`. Child processes only."""
    module = _import_file(Path(harness_dir) / "rewards.py", "harness_rewards")
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
    module = _import_file(Path(harness_dir) / "filters.py", "harness_filters")
    out = []
    for name in spec.filters:
        fn = getattr(module, name, None)
        if not callable(fn):
            raise UserError(f"filters.py has no function {name!r} named in harness.yaml")
        out.append(fn)
    return out
