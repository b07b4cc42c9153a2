"""`evotrainer train`: warm policy -> sealed dev eval -> GRPO under a harness -> sealed dev eval.

The parent side of one training job. It owns the output directory's layout:

    OUT/request.json                 the request this directory was started with (a rerun must match)
    OUT/checkpoints/<id>/            the trained policy + meta.json
    OUT/evidence/g0/main/*.parquet   rollouts and per-step aggregates
    OUT/trl/                         resumable trainer state while training runs
    OUT/logs/, OUT/specs/            child logs and the specs they were started with
    OUT/result.json                  the printed summary

Re-running the same command on the same OUT resumes an interrupted run exactly.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from evotrainer.base.errors import UserError
from evotrainer.base.files import atomic_write_text
from evotrainer.trainer import jobs
from evotrainer.trainer.domains import get_domain
from evotrainer.trainer.grpo import TrainSpec
from evotrainer.trainer.harness import load_spec
from evotrainer.workspaces import TEMPLATES
from evotrainer.workspaces.repo import harness_commit

# GRPO steps of `evotrainer train` when --steps is not given. SWE episodes cost ~20x a math step, and the
# template's history leak takes over within ~40 steps (README: the SWE domain).
DEFAULT_STEPS = {"math": 150, "code": 150, "swe": 40}
DEFAULT_EVAL_K = {"swe": 1}  # samples per dev item for avg@k: 400 SWE episodes take ~80 s to play


class TrainRequest(BaseModel):
    domain: str = "math"
    steps: int = 150
    seed: int = 0
    out: str
    harness: str | None = None  # default: the domain's template
    checkpoint: str | None = None  # default: the cached warm policy
    model: str | None = None  # a pretrained model (trainer/pretrained.py): a HF directory, a .gguf file, smollm2
    device: str = "cpu"  # cpu or cuda
    vllm: bool = False  # generation by vLLM (cuda only)
    processes: int = 1  # data-parallel training ranks: GPUs on cuda, cores on cpu
    eval_k: int = 4
    eval_limit: int | None = None


def _check_request(req: TrainRequest, out: Path) -> None:
    """A directory holds one training run: the same request resumes it, another one is refused."""
    path = out / "request.json"
    if path.is_file():
        before = TrainRequest.model_validate_json(path.read_text())
        if before != req:
            diff = {k: (getattr(before, k), getattr(req, k)) for k in req.model_fields if
                    getattr(before, k) != getattr(req, k)}
            raise UserError(f"{out} holds another training run (differs in {diff}); choose a new --out "
                            "or repeat the original command to resume it")
    else:
        path.write_text(req.model_dump_json(indent=2))


def preset_harness(harness: Path, model_dir: Path, dest: Path) -> tuple[Path, dict]:
    """`harness` with the recipe of the model's size (`PRESETS`) written into a copy at `dest`; (dir, knobs set).
    With nothing to change, `harness` itself."""
    from evotrainer.agents.offline.edits import set_knob
    from evotrainer.trainer.pretrained import parameter_count, preset_for

    knobs = preset_for(parameter_count(model_dir))
    if not knobs:
        return harness, {}
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(harness, dest, ignore=shutil.ignore_patterns(".git", "__pycache__"))
    text = (dest / "harness.yaml").read_text()
    for key, value in knobs.items():
        text = set_knob(text, key, value, comment="the preset of the model's size (trainer/pretrained.py)")
    (dest / "harness.yaml").write_text(text)
    return dest, knobs


def check_device(device: str, vllm: bool, processes: int = 1) -> None:
    """One clear line when the device, the ranks or the generation backend asked for are not there."""
    if device not in ("cpu", "cuda"):
        raise UserError(f"--device {device!r}: choose cpu or cuda")
    cores = len(os.sched_getaffinity(0))
    if processes < 1 or (device == "cpu" and processes > cores):
        raise UserError(f"--processes {processes}: choose 1 to {cores} (the cores this machine gives this process) "
                        "on the CPU, or one per GPU with --device cuda")
    if vllm and device != "cuda":
        raise UserError("--vllm generates on a GPU: add --device cuda")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UserError("--device cuda: torch sees no CUDA device (the torch installed here may be the CPU "
                            "build: install a CUDA build of torch on a machine with an NVIDIA GPU)")
        if processes > torch.cuda.device_count():
            raise UserError(f"--processes {processes}: torch sees {torch.cuda.device_count()} CUDA device(s), one "
                            "per rank: ask for at most that many")
    if vllm:
        try:
            import vllm as _  # noqa: F401
        except ImportError as e:
            raise UserError("--vllm needs vLLM: pip install -e '.[vllm]'") from e


def run_train(req: TrainRequest, feed: Callable[[str], Callable[[dict], None]]) -> dict:
    """Run (or resume) one training job and return its summary (also written to OUT/result.json)."""
    started = time.time()
    get_domain(req.domain)  # unknown domain: one clear line before anything else
    out = Path(req.out).resolve()
    harness = Path(req.harness).resolve() if req.harness else TEMPLATES / req.domain
    spec = load_spec(harness, req.processes)  # YAML and schema only: no harness code runs in this process
    if spec.domain != req.domain:
        raise UserError(f"harness {harness} is for domain {spec.domain!r}, not {req.domain!r}")
    check_device(req.device, req.vllm, req.processes)
    if req.checkpoint and req.model:
        raise UserError("--checkpoint and --model both name the starting policy: pass one of them")
    if req.checkpoint and not (Path(req.checkpoint) / "config.json").is_file():
        raise UserError(f"checkpoint {req.checkpoint} not found or not a model directory (no config.json): "
                        "pass a directory written by `evotrainer train` or a local Hugging Face model")
    _check_request(req, out)
    done = out / "result.json"
    if done.is_file():
        return json.loads(done.read_text())

    preset: dict = {}
    if req.model:  # a pretrained model: converted once if it is GGUF, the recipe sized to it in a copy of the harness
        from evotrainer.trainer.pretrained import resolve_model

        start = resolve_model(req.model)
        harness, preset = preset_harness(harness, start, out / "harness-preset")
    else:
        start = Path(req.checkpoint).resolve() if req.checkpoint else \
            jobs.warm_policy(req.domain, req.seed, out, on_progress=feed("warm-up (SFT, cached)"))
    ckpt_id = f"{req.domain}-s{req.seed}-{req.steps}steps"
    tspec = TrainSpec(
        domain=req.domain, checkpoint=str(start), harness_dir=str(harness), steps=req.steps, seed=req.seed,
        out_dir=str(out), checkpoint_id=ckpt_id, checkpoints_dir=str(out / "checkpoints"),
        evidence_dir=str(out / "evidence"), run=out.name, harness_commit=harness_commit(harness),
        result_path=str(out / "specs" / "train.result.json"), device=req.device, use_vllm=req.vllm,
        processes=req.processes,
    )
    # dev_before and training are independent: run them side by side, one core each (DESIGN §12)
    before: dict = {}

    def eval_before() -> None:
        try:
            before["result"] = jobs.evaluate(start, req.domain, "dev", out, k=req.eval_k, limit=req.eval_limit,
                                             seed=req.seed)
        except UserError as e:
            before["error"] = e

    thread = threading.Thread(target=eval_before)
    thread.start()
    try:
        meta = jobs.train(tspec, out, on_progress=feed("GRPO training"))
    finally:
        thread.join()
    if "error" in before:
        raise before["error"]
    ckpt = out / "checkpoints" / ckpt_id
    after = jobs.evaluate(ckpt, req.domain, "dev", out, k=req.eval_k, limit=req.eval_limit, seed=req.seed)
    b = before["result"]
    result = {
        "domain": req.domain, "steps": meta["steps"], "seed": req.seed, "processes": req.processes,
        "dev_before": b.accuracy, "dev_after": after.accuracy,
        "dev_before_avg": b.avg_at_k, "dev_after_avg": after.avg_at_k, "eval_k": req.eval_k,
        "dev_items": after.n_items, "dev_before_by_difficulty": b.by_difficulty,
        "dev_after_by_difficulty": after.by_difficulty,
        "checkpoint": str(ckpt), "start_checkpoint": str(start), "harness": str(harness), "preset": preset,
        "harness_commit": tspec.harness_commit, "evidence": str(out / "evidence"),
        "train_reward_first": meta["metrics"]["train_reward_first"],
        "train_reward_last": meta["metrics"]["train_reward_last"],
        "frac_zero_std_mean": meta["metrics"]["frac_zero_std_mean"],
        "train_seconds": meta["seconds"], "seconds": round(time.time() - started, 1),
        "fingerprint": after.fingerprint,
    }
    meta_path = ckpt / "meta.json"
    meta["metrics"].update({"dev_accuracy": after.accuracy, "dev_avg_at_k": after.avg_at_k})
    atomic_write_text(meta_path, json.dumps(meta, indent=2))
    atomic_write_text(done, json.dumps(result, indent=2))
    return result
