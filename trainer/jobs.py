"""Parent-side launchers: warm-up, training and sealed evaluation, each in its own child process.

The orchestrator (CLI, graph) never imports torch, TRL or harness code; it calls these functions,
which write a spec, start the child through `sandbox.run_module`, and read back a typed result.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from evotrainer.errors import UserError
from evotrainer.files import atomic_write_text
from evotrainer.trainer.evaluate import EvalResult, EvalSpec
from evotrainer.trainer.grpo import TrainSpec
from evotrainer.trainer.policy import ModelConfig, WarmupConfig, cache_key, cache_root, cached_policy, default_configs
from evotrainer.trainer.sandbox import ChildResult, Limits, run_module

Progress = Callable[[dict], None] | None


class ChildFailed(UserError):
    """A child process failed; the message names the job and the reason in one line."""

    def __init__(self, result: ChildResult, log_path: Path):
        super().__init__(f"{result.message} (log: {log_path})")
        self.result = result


def _write_spec(spec, path: Path) -> None:
    atomic_write_text(path, spec.model_dump_json(indent=2))


def run_child(module: str, args: list[str], *, cwd: Path, log: Path, limits: Limits, label: str,
              on_progress: Progress = None) -> ChildResult:
    """A child that reports bad input as a `UserError: <sentence>` line (exit 3): that sentence becomes this
    process's UserError; any other failure is a ChildFailed naming the job, the reason and the log."""
    res = run_module(module, args, cwd=cwd, log_path=log, limits=limits, on_progress=on_progress, label=label)
    if not res.ok:
        if res.returncode == 3 and "UserError: " in res.log_tail:
            raise UserError(res.log_tail.rsplit("UserError: ", 1)[1].strip())
        raise ChildFailed(res, log)
    return res


def warm_policy(domain: str, seed: int, work_dir: Path, *, model_cfg: ModelConfig | None = None,
                warm_cfg: WarmupConfig | None = None, on_progress: Progress = None) -> Path:
    """The cached warm policy for (domain, seed, configs), built in a child process on a cache miss."""
    default_model, default_warm = default_configs(domain)
    model_cfg, warm_cfg = model_cfg or default_model, warm_cfg or default_warm
    hit = cached_policy(domain, seed, model_cfg, warm_cfg)
    if hit:
        return hit
    spec_path = work_dir / "specs" / f"warmup-{cache_key(domain, seed, model_cfg, warm_cfg)}.json"
    spec_path.parent.mkdir(parents=True, exist_ok=True)
    spec_path.write_text(json.dumps({"domain": domain, "seed": seed, "model": asdict(model_cfg),
                                     "warmup": asdict(warm_cfg)}))
    log = work_dir / "logs" / "warmup.log"
    res = run_module("evotrainer.trainer.policy", [str(spec_path)], cwd=work_dir, log_path=log,
                     limits=Limits(timeout_s=3 * 3600), on_progress=on_progress,
                     label=f"warm-up of the {domain} policy")
    if not res.ok:
        raise ChildFailed(res, log)
    hit = cached_policy(domain, seed, model_cfg, warm_cfg)
    if not hit:
        raise UserError(f"warm-up finished but wrote no policy under {cache_root()}: check its log {log}")
    return hit


def evaluate(checkpoint: str | Path, domain: str, split: str, work_dir: Path, *, k: int = 4,
             limit: int | None = None, seed: int = 0, expected_fingerprint: str | None = None,
             on_progress: Progress = None) -> EvalResult:
    """Sealed evaluation in a child; results of an EvoTrainer checkpoint (immutable) are cached beside it."""
    checkpoint = Path(checkpoint).resolve()
    if not (checkpoint / "config.json").is_file():
        raise UserError(f"checkpoint {checkpoint} not found or not a model directory (no config.json)")
    key = f"{domain}-{split}-k{k}-s{seed}-n{limit or 'all'}"
    cached = checkpoint / "evals" / f"{key}.json"
    if cached.is_file():
        result = EvalResult.model_validate_json(cached.read_text())
        if expected_fingerprint in (None, result.fingerprint) and _fingerprint_now(domain) == result.fingerprint:
            return result
    result_path = work_dir / "specs" / f"eval-{checkpoint.name}-{key}.result.json"
    spec = EvalSpec(checkpoint=str(checkpoint), domain=domain, split=split, k=k, limit=limit, seed=seed,
                    expected_fingerprint=expected_fingerprint, result_path=str(result_path))
    spec_path = result_path.with_name(result_path.name.replace(".result", ".spec"))
    _write_spec(spec, spec_path)
    log = work_dir / "logs" / f"eval-{checkpoint.name}-{split}.log"
    # a changed sealed scorer comes back as the child's own sentence
    run_child("evotrainer.trainer.evaluate", [str(spec_path)], cwd=work_dir, log=log, limits=Limits(timeout_s=3600),
              on_progress=on_progress, label=f"evaluation of {checkpoint.name}")
    result = EvalResult.model_validate_json(result_path.read_text())
    if (checkpoint / "meta.json").is_file() and os.access(checkpoint, os.W_OK):  # ours, never a user's model
        atomic_write_text(cached, result.model_dump_json())
    return result


def _fingerprint_now(domain: str) -> str:
    from evotrainer.trainer.domains import fingerprint, get_domain

    return fingerprint(get_domain(domain))


def train(spec: TrainSpec, work_dir: Path, *, on_progress: Progress = None, limits: Limits | None = None) -> dict:
    """GRPO training in a child whose working directory is the harness; returns the checkpoint's meta."""
    spec_path = work_dir / "specs" / f"train-{spec.checkpoint_id}.json"
    _write_spec(spec, spec_path)
    log = work_dir / "logs" / f"train-{spec.checkpoint_id}.log"
    res = run_module("evotrainer.trainer.grpo", [str(spec_path)], cwd=spec.harness_dir, log_path=log,
                     limits=limits or Limits(timeout_s=6 * 3600), on_progress=on_progress,
                     label=f"training {spec.checkpoint_id} with harness {spec.harness_dir}")
    if not res.ok:
        raise ChildFailed(res, log)
    return json.loads(Path(spec.result_path).read_text())


def validate_harness(harness_dir: str | Path, work_dir: Path, *, label: str | None = None,
                     limits: Limits | None = None) -> list[str]:
    """Problems of a harness (empty: valid), found by importing and calling its code in a sandboxed child."""
    harness_dir = Path(harness_dir).resolve()
    label = label or f"harness {harness_dir}"
    result_path = work_dir / "specs" / f"validate-{harness_dir.name}-{os.getpid()}.json"
    result_path.parent.mkdir(parents=True, exist_ok=True)
    result_path.unlink(missing_ok=True)
    log = work_dir / "logs" / f"validate-{harness_dir.name}.log"
    res = run_module("evotrainer.trainer.harness", [str(harness_dir), str(result_path)], cwd=harness_dir, log_path=log,
                     limits=limits or Limits(timeout_s=120, memory_mb=4096), label=label)
    if not res.ok:
        return [res.message]
    return [f"{label}: {p}" for p in json.loads(result_path.read_text())["problems"]]
