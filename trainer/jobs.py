"""Parent-side launchers: warm-up, training, validation and sealed evaluation, each in its own child process.

The orchestrator (CLI, graph) never imports torch, TRL or harness code; it calls these functions,
which write a spec, start the child through `run_child` (`sandbox.run_module`, with a child's own bad-input
sentence raised here as a UserError), and read back a typed result (`call_child` does all three for a spec'd
child; validation keeps its own call because a failing child is a problem to report, not an error).
Children that run harness code (training, validation) start isolated (`sandbox.Isolation`): the parent
hands them what they may see as files, and everything sealed is done here, after they end: the training
child's rollouts are graded by the sealed scorer in this process, its policy is installed by this process.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
import warnings
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import NamedTuple, TypeVar

from filelock import FileLock
from pydantic import BaseModel

from evotrainer.base.errors import UserError
from evotrainer.base.files import atomic_write_text
from evotrainer.trainer.evaluate import EvalResult, EvalSpec
from evotrainer.trainer.grpo import TrainSpec, child_dir, state_step
from evotrainer.trainer.policy import ModelConfig, WarmupConfig, cache_key, cache_root, cached_policy, default_configs
from evotrainer.trainer.sandbox import ChildResult, Isolation, Limits, isolation_mode, run_module

Progress = Callable[[dict], None] | None
# each child's kind, as the executor counts it (a run's `run_end` event lists them)
JOB_KINDS = {"evotrainer.trainer.grpo": "training", "evotrainer.trainer.evaluate": "sealed_evaluation",
             "evotrainer.trainer.backtest.replay": "replay", "evotrainer.trainer.policy": "warm_up",
             "evotrainer.trainer.diagnostics.report": "diagnosis",
             "evotrainer.trainer.diagnostics.history": "analyzer_validation"}


class ChildFailed(UserError):
    """A child process failed; the message names the job and the reason in one line."""

    def __init__(self, result: ChildResult, log_path: Path):
        super().__init__(f"{result.message} (log: {log_path})")
        self.result = result


def _write_spec(spec, path: Path) -> None:
    atomic_write_text(path, spec.model_dump_json(indent=2))


def run_child(module: str, args: list[str], *, cwd: Path, log: Path, limits: Limits, label: str,
              on_progress: Progress = None, isolation: Isolation | None = None, processes: int = 1) -> ChildResult:
    """A child that reports bad input as a `UserError: <sentence>` line (exit 3): that sentence becomes this
    process's UserError; any other failure is a ChildFailed naming the job, the reason and the log. The child
    runs where this process's executor runs jobs (`executor.py`: here, or a Ray worker that starts it the same way;
    a Ray task's progress does not come back). A child of several `processes` (training ranks) asks for a GPU
    each where it trains on GPUs, else a CPU each."""
    from evotrainer.trainer import executor

    ex = executor.current()
    gpu = isolation is not None and isolation.gpu
    res = ex.call(JOB_KINDS.get(module, module), run_module, module, args, cwd=cwd, log_path=log, limits=limits,
                  on_progress=on_progress if ex.name == "local" else None, label=label, isolation=isolation,
                  cpus=1 if gpu else processes, gpus=processes if gpu else 0)
    if not res.ok:
        if res.returncode == 3 and "UserError: " in res.log_tail:
            raise UserError(res.log_tail.rsplit("UserError: ", 1)[1].strip())
        raise ChildFailed(res, log)
    return res


M = TypeVar("M", bound=BaseModel)


def call_child(module: str, spec: BaseModel, result_type: type[M], *, work: Path, name: str, cwd: Path,
               limits: Limits, label: str, read: list[str] | None = None, on_progress: Progress = None) -> M:
    """The one way the parent runs a child on a spec and reads its answer. The spec, its `result_path` pointed
    into a fresh output directory, is written to `work/specs/<name>-<id>.spec.json`; the child runs
    (`python -m module SPEC`, through `run_child`): isolated when `read` is given, reading only those paths and
    the spec and writing only its output directory; its result is validated as `result_type`, and the output
    directory is removed. The log is `work/logs/<name>.log`."""
    stem = f"{name}-{uuid.uuid4().hex[:8]}"  # unique: several children of one kind may run at once
    out = work / "specs" / stem
    out.mkdir(parents=True, exist_ok=True)
    spec = spec.model_copy(update={"result_path": str(out / "result.json")})
    spec_path = work / "specs" / f"{stem}.spec.json"
    _write_spec(spec, spec_path)
    log = work / "logs" / f"{name}.log"
    isolation = Isolation(read=[*read, str(spec_path)], write=[str(out)]) if read is not None else None
    try:
        run_child(module, [str(spec_path)], cwd=cwd, log=log, limits=limits, label=label, on_progress=on_progress,
                  isolation=isolation)
        try:
            return result_type.model_validate_json((out / "result.json").read_text())
        except (OSError, ValueError) as e:
            raise UserError(f"{label}: the child wrote no readable result ({type(e).__name__}; log: {log})") from e
    finally:
        shutil.rmtree(out, ignore_errors=True)


def warm_policy(domain: str, seed: int, work_dir: Path, *, model_cfg: ModelConfig | None = None,
                warm_cfg: WarmupConfig | None = None, on_progress: Progress = None) -> Path:
    """The cached warm policy for (domain, seed, configs), built in a child process on a cache miss."""
    default_model, default_warm = default_configs(domain)
    model_cfg, warm_cfg = model_cfg or default_model, warm_cfg or default_warm
    hit = cached_policy(domain, seed, model_cfg, warm_cfg)
    if hit:
        return hit
    key = cache_key(domain, seed, model_cfg, warm_cfg)
    cache_root().mkdir(parents=True, exist_ok=True)
    # two processes missing the same policy at once (`compare --jobs 2`, two benchmark processes): one builds it, the
    # other waits for it and reads it, instead of both warming up on the same cores (each 2-3x slower)
    with FileLock(str(cache_root() / f"{key}.lock")):
        for stale in cache_root().glob(f"{key}.tmp*"):  # a killed warm-up's half-written copy: nobody else builds it
            shutil.rmtree(stale, ignore_errors=True)
        hit = cached_policy(domain, seed, model_cfg, warm_cfg)
        if hit:
            return hit
        spec_path = work_dir / "specs" / f"warmup-{key}.json"
        spec_path.parent.mkdir(parents=True, exist_ok=True)
        spec_path.write_text(json.dumps({"domain": domain, "seed": seed, "model": asdict(model_cfg),
                                         "warmup": asdict(warm_cfg)}))
        log = work_dir / "logs" / "warmup.log"
        run_child("evotrainer.trainer.policy", [str(spec_path)], cwd=work_dir, log=log,
                  limits=Limits(timeout_s=3 * 3600), on_progress=on_progress, label=f"warm-up of the {domain} policy")
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
    spec = EvalSpec(checkpoint=str(checkpoint), domain=domain, split=split, k=k, limit=limit, seed=seed,
                    expected_fingerprint=expected_fingerprint, result_path="")
    # a changed sealed scorer comes back as the child's own sentence
    result = call_child("evotrainer.trainer.evaluate", spec, EvalResult, work=work_dir,
                        name=f"eval-{checkpoint.name}-{split}", cwd=work_dir, limits=Limits(timeout_s=3600),
                        label=f"evaluation of {checkpoint.name}", on_progress=on_progress)
    if (checkpoint / "meta.json").is_file() and os.access(checkpoint, os.W_OK):  # ours, never a user's model
        atomic_write_text(cached, result.model_dump_json())
    return result


def _fingerprint_now(domain: str) -> str:
    from evotrainer.trainer.domains import fingerprint, get_domain

    return fingerprint(get_domain(domain))


def prompts_needed(spec: TrainSpec, knobs: dict) -> int:
    """Train prompts a line of `spec.horizon` steps draws (at least 1,000, so a filter has something to choose
    from): every job of one line gets the same rows, so the data order continues across them."""
    from evotrainer.trainer.harness import TRAINER_DEFAULTS

    knobs = {**TRAINER_DEFAULTS, **knobs}
    batch = knobs["per_device_train_batch_size"] * (knobs.get("steps_per_generation")
                                                    or knobs.get("gradient_accumulation_steps") or 1)
    return max((spec.horizon or spec.steps) * batch // knobs["num_generations"], 1000)


def _sealed_env(domain) -> dict | None:
    """A multi-turn domain's sealed tool environment as data for a child (`harness.load_env_config` reads it)."""
    env = getattr(domain, "sealed_env", None)
    return {**asdict(env), "tools": list(env.tools)} if env else None


class TrainingJob(NamedTuple):
    """A training child ready to start: its spec file, its view, and what the parent grades with afterwards."""

    spec_path: Path
    isolation: Isolation
    domain: object
    tasks: dict  # prompt_id -> Task: the train tasks the child was given


def prepare_training(spec: TrainSpec, work_dir: Path) -> TrainingJob:
    """Write the train rows (sealed columns removed) and the child's spec; nothing of the harness runs here."""
    from evotrainer.trainer.domains import get_domain
    from evotrainer.trainer.harness import load_spec

    domain = get_domain(spec.domain)
    knobs = load_spec(spec.harness_dir, spec.processes).trainer  # YAML only: the harness's code runs in the child
    if spec.horizon is not None:
        end = (state_step(spec.resume_state) if spec.resume_state else 0) + spec.steps
        if end > spec.horizon:
            raise UserError(f"training {spec.checkpoint_id} would end at step {end}, past its line's horizon of "
                            f"{spec.horizon} steps: raise the horizon or train fewer steps")
    tasks = domain.tasks("train", prompts_needed(spec, knobs), seed=spec.seed)
    sealed = getattr(domain, "sealed_columns", ())
    rows_path = work_dir / "specs" / f"train-{spec.checkpoint_id}.rows.json"
    rows_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(rows_path, json.dumps([t.row(sealed) for t in tasks]))
    child = spec.model_copy(update={"rows_path": str(rows_path), "env": _sealed_env(domain)})
    spec_path = work_dir / "specs" / f"train-{spec.checkpoint_id}.json"
    _write_spec(child, spec_path)
    start = Path(spec.checkpoint)
    if (start / "meta.json").is_file() and os.access(start, os.W_OK):
        # ours (evaluate caches here): the cache folder exists before the child starts, so its mask holds even
        # when an evaluation of the same policy writes its first result while the child trains
        (start / "evals").mkdir(exist_ok=True)
    iso = Isolation(read=[spec.harness_dir, spec.checkpoint, *([spec.resume_state] if spec.resume_state else []),
                          str(spec_path), str(rows_path)], write=[str(child_dir(spec))], gpu=spec.device != "cpu")
    return TrainingJob(spec_path, iso, domain, {t.id: t for t in tasks})


def train(spec: TrainSpec, work_dir: Path, *, on_progress: Progress = None, limits: Limits | None = None) -> dict:
    """GRPO training in an isolated child whose working directory is the harness; returns the checkpoint's meta.

    The child sees the harness, the starting policy and the train rows written here, and writes only under
    `child_dir(spec)`; its rollouts are graded here (`grade_evidence`) and its policy installed here."""
    job = prepare_training(spec, work_dir)
    out = child_dir(spec)
    log = work_dir / "logs" / f"train-{spec.checkpoint_id}.log"
    run_child("evotrainer.trainer.grpo", [str(job.spec_path)], cwd=Path(spec.harness_dir), log=log,
              limits=limits or Limits(timeout_s=6 * 3600), on_progress=on_progress,
              label=f"training {spec.checkpoint_id} with harness {spec.harness_dir}", isolation=job.isolation,
              processes=spec.processes)
    try:
        result = json.loads((out / "result.json").read_text())
        steps = int(result["steps"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"training {spec.checkpoint_id} ended without a readable result ({e}): see its log {log}"
                        ) from e
    grade_evidence(spec, job.domain, job.tasks)
    from evotrainer.trainer.harness import load_spec

    meta = {
        "id": spec.checkpoint_id, "parent": spec.checkpoint, "domain": spec.domain,
        "harness": str(Path(spec.harness_dir).resolve()), "harness_commit": spec.harness_commit,
        "steps": steps, "global_step": int(result.get("global_step", steps)), "horizon": spec.horizon or spec.steps,
        "seed": spec.seed, "reseed": spec.reseed, "generation": spec.generation, "branch": spec.branch,
        "continued": spec.resume_state, "fresh_optimizer": spec.fresh_optimizer,
        "optimizer": optimizer_knobs(load_spec(spec.harness_dir, spec.processes).trainer), "state": spec.keep_state,
        "resumed_from": result.get("resumed_from"), "seconds": result.get("seconds"),
        "metrics": result.get("metrics", {}), "isolation": isolation_mode(), "processes": spec.processes,
    }
    dest = Path(spec.checkpoints_dir) / spec.checkpoint_id
    _install_policy(out / "final", dest, meta, state=out / "state" if spec.keep_state else None)
    keep_curves(out / "tensorboard", Path(spec.out_dir) / "tensorboard")
    shutil.rmtree(out, ignore_errors=True)
    atomic_write_text(Path(spec.result_path), json.dumps(meta))
    return meta


def keep_curves(written: Path, dest: Path) -> list[Path]:
    """Move the TensorBoard event files a training child wrote (regular files named as TensorBoard names them, at
    any depth, nothing else) into `dest`, one directory per job: `tensorboard --logdir RUN` lists each job by its
    path in the run. A job that resumed after a crash wrote two files; both are kept (TensorBoard merges them)."""
    kept = []
    for p in sorted(written.rglob("events.out.tfevents.*")) if written.is_dir() else []:
        if p.is_file() and not p.is_symlink():
            dest.mkdir(parents=True, exist_ok=True)
            os.replace(p, dest / p.name)
            kept.append(dest / p.name)
    return kept


def _regular_files_only(d: Path) -> None:
    """Leave only regular files in `d` (no directory, symlink or device a child could have planted)."""
    for p in list(d.iterdir()):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.is_symlink() or not p.is_file():
            p.unlink()


def _install_policy(final: Path, dest: Path, meta: dict, state: Path | None = None) -> None:
    """Move the child's saved policy to its checkpoint directory: model files only (a child never hands over
    an evaluation cache or its own meta.json), with the trainer state it kept for the line's next job under
    `state/` (read only by training children, never by this process or an evaluation), then meta.json written
    here, last (its presence = done)."""
    if not (final / "config.json").is_file():
        raise UserError(f"the training child saved no policy under {final}")
    _regular_files_only(final)
    (final / "meta.json").unlink(missing_ok=True)
    if state is not None:
        if not (state / "trainer_state.json").is_file():
            raise UserError(f"the training child kept no trainer state under {state}")
        _regular_files_only(state)
        os.replace(state, final / "state")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staged = dest.with_name(dest.name + ".installing")  # beside dest: the child's directory may lie inside it
    shutil.rmtree(staged, ignore_errors=True)
    os.replace(final, staged)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(staged, dest)
    atomic_write_text(dest / "meta.json", json.dumps(meta, indent=2))


# the GRPOConfig knobs the optimizer and scheduler state embody: a job that changes one cannot continue the line's
# optimizer state (TRL would restore the old learning rate with it) and starts them anew (`fresh_optimizer`)
OPTIMIZER_KNOBS = ("learning_rate", "lr_scheduler_type", "warmup_steps", "weight_decay", "adam_beta1", "adam_beta2")


def optimizer_knobs(trainer: dict) -> dict:
    from evotrainer.trainer.harness import TRAINER_DEFAULTS

    knobs = {**TRAINER_DEFAULTS, **trainer}
    return {k: knobs.get(k) for k in OPTIMIZER_KNOBS}


def continuation(checkpoint: str | Path, harness_dir: str | Path) -> dict:
    """How a job under `harness_dir` continues the line `checkpoint` is on: `resume_state` (its kept state, None
    when it kept none) and `fresh_optimizer` (an optimizer setting differs from the one that state was trained
    with). TrainSpec keywords."""
    from evotrainer.trainer.harness import load_spec

    checkpoint = Path(checkpoint)
    meta_path, state = checkpoint / "meta.json", checkpoint / "state"
    if not meta_path.is_file() or not (state / "trainer_state.json").is_file():
        return {"resume_state": None, "fresh_optimizer": False}
    before = json.loads(meta_path.read_text()).get("optimizer")
    return {"resume_state": str(state),
            "fresh_optimizer": before != optimizer_knobs(load_spec(harness_dir).trainer)}


def grade_evidence(spec: TrainSpec, domain, tasks: dict) -> int:
    """Grade the training child's raw rollouts with the sealed scorer and write them to the run's evidence.

    Every sealed column (`correct`, `formatted`, the domain's own) comes from here; a row whose prompt is not
    the train task it names is refused. Returns the number of rows graded."""
    import pyarrow.parquet as pq

    from evotrainer.trainer.domains import grade_all
    from evotrainer.trainer.evidence import EvidenceWriter, branch_dir

    raw = child_dir(spec) / "evidence" / f"g{spec.generation}" / branch_dir(spec.branch)
    dest = EvidenceWriter(spec.evidence_dir, spec.generation, spec.branch, spec.evidence_tag)
    dest.truncate_after(0)  # this writer's chunks are all rewritten from the child's
    sealed_cols = {"correct", "formatted", *getattr(domain, "evidence_columns", ())}
    prefix = f"{branch_dir(spec.evidence_tag)}-" if spec.evidence_tag else ""
    n = 0
    for path in sorted(raw.glob(f"steps-{prefix}[0-9]*.parquet")):  # per-step aggregates: no sealed column
        for row in pq.read_table(path).to_pylist():
            dest.add_step(row)
        dest.flush(int(path.stem.rsplit("-", 1)[1]))
    for path in sorted(raw.glob(f"rollouts-{prefix}[0-9]*.parquet")):
        rows = [{k: v for k, v in r.items() if k not in sealed_cols} for r in pq.read_table(path).to_pylist()]
        for r in rows:
            task = tasks.get(r["prompt_id"])
            if task is None or task.prompt != r["prompt"]:
                raise UserError(f"training {spec.checkpoint_id} wrote a rollout whose prompt is not the train task "
                                f"{r['prompt_id']!r}: the harness changed its training data")
            r.update(run=spec.run, generation=spec.generation, branch=spec.branch, harness_commit=spec.harness_commit,
                     checkpoint=spec.checkpoint_id)
        ts = [tasks[r["prompt_id"]] for r in rows]
        with warnings.catch_warnings():  # a completion such as `2if x else 1` parses, with a SyntaxWarning the
            warnings.simplefilter("ignore", SyntaxWarning)  # orchestrator would print into its log for every run
            grades = grade_all(domain, [r["completion"] for r in rows], [t.answer for t in ts], [t.fmt for t in ts],
                               [t.prompt for t in ts])
        for r, g in zip(rows, grades):
            r.update(correct=g.correct, formatted=g.formatted, **g.columns)
        dest.add_rollouts(rows)
        dest.flush(int(path.stem.rsplit("-", 1)[1]))
        n += len(rows)
    return n


def validate_harness(harness_dir: str | Path, work_dir: Path, *, label: str | None = None,
                     limits: Limits | None = None) -> list[str]:
    """Problems of a harness (empty: valid), found by importing and calling its code in an isolated child on a
    sample batch made here (the child never sees the domain's sealed side)."""
    from evotrainer.trainer.domains import get_domain
    from evotrainer.trainer.evaluate import check_sealed
    from evotrainer.trainer.harness import load_spec, sample_batch

    harness_dir = Path(harness_dir).resolve()
    label = label or f"harness {harness_dir}"
    try:
        hspec = load_spec(harness_dir)
        domain = get_domain(hspec.domain)
    except UserError as e:
        return [f"{label}: {e}"]
    check_sealed(domain)  # the sealed side must be intact before anything is judged
    stamp = f"{harness_dir.name}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    specs = work_dir / "specs"
    batch_path, out = specs / f"validate-{stamp}.batch.json", specs / f"validate-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(batch_path, json.dumps({"batch": sample_batch(domain), "env": _sealed_env(domain)}))
    log = work_dir / "logs" / f"validate-{harness_dir.name}.log"
    try:
        res = run_module("evotrainer.trainer.harness", [str(harness_dir), str(batch_path), str(out / "result.json")],
                         cwd=harness_dir, log_path=log, limits=limits or Limits.by_cpu(240, memory_mb=4096),
                         label=label, isolation=Isolation(read=[str(harness_dir), str(batch_path)], write=[str(out)]))
        if not res.ok:
            return [res.message]
        try:
            problems = json.loads((out / "result.json").read_text())["problems"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            return [f"{label}: the validation child wrote no readable result ({e})"]
        return [f"{label}: {p}" for p in problems]
    finally:
        shutil.rmtree(out, ignore_errors=True)
        batch_path.unlink(missing_ok=True)
