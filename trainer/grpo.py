"""GRPO backend: train a policy N steps with a harness, capturing one evidence row per rollout.

This module runs as an isolated child process (`python -m evotrainer.trainer.grpo SPEC.json`, started
by `jobs.train` under bubblewrap): it is where a harness's reward functions and filters are imported,
with the harness directory as working directory. It never sees the sealed side: the parent hands it the
train-split rows (without sealed columns) in a file, and it writes everything it makes under
`<out_dir>/child/` (`child_dir`), the one directory it may write. The parent then grades the raw evidence
with the sealed scorer (`correct`, `formatted`, the domain's episode columns) and installs the checkpoint.

Evidence capture is a small GRPOTrainer subclass (DESIGN §11): `_calculate_rewards` keeps the
per-function rewards, `_generate_and_score_completions` turns the parent's output (completion ids,
mask, advantages) plus the dataset columns into rows and adds the mean token log-probability under the
sampling policy.

With `processes > 1` this module first starts that many ranks of itself under torchrun (`launch_ranks`), inside the
same sandbox. TRL gives each rank a contiguous slice of a step's batch, so one group's samples may sit on two ranks;
each rank's rows carry their place in the whole batch (group ids, rewards), rank 0 gathers and writes every row, and
group filters decide on whole groups (rank 0 runs them and tells the others).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

from pydantic import BaseModel, Field

from evotrainer.trainer.evidence import STEP_METRICS, EvidenceWriter
from evotrainer.trainer.sandbox import progress


class TrainSpec(BaseModel):
    """Everything a training child needs; written to JSON by the parent."""

    domain: str
    checkpoint: str  # the starting policy
    harness_dir: str
    steps: int  # GRPO steps this job trains
    seed: int = 0  # TRL's seed and data seed: the line's data order
    # one training line continued across jobs (the loop's main line, short runs branching from it): the line's
    # planned length (TRL's max_steps, so the schedule and the data order are the line's, not the job's), the
    # trainer state of the job it continues (optimizer, scheduler, RNG, data position, weights), and what this job
    # changes of it
    horizon: int | None = None  # None: this job is the whole line (steps)
    resume_state: str | None = None  # a `state/` directory an earlier job of the line kept
    fresh_optimizer: bool = False  # drop the optimizer and scheduler state (an optimizer setting changed)
    reseed: int | None = None  # reseed sampling after resuming: a replicate of the same state (short-run seed s)
    keep_state: bool = False  # keep this job's final trainer state for the next job of the line
    out_dir: str  # holds trl/ (resumable state) and the final checkpoint
    checkpoint_id: str
    checkpoints_dir: str
    evidence_dir: str
    run: str = "run"
    generation: int = 0
    branch: str = "main"
    harness_commit: str = ""
    evidence_tag: str = ""  # set when several runs of one branch share its evidence folder (backtest seeds)
    save_every: int = 25
    device: str = "cpu"  # cpu or cuda
    # data-parallel ranks (torchrun's, one process each: a GPU each on cuda, a core each on cpu); the harness's batch
    # is per rank, as in TRL, so a step sees processes x per_device_train_batch_size completions
    processes: int = Field(1, ge=1)
    use_vllm: bool = False  # TRL's vLLM generation in colocate mode (cuda only; the `vllm` extra)
    result_path: str
    # set by the parent (jobs.train) for the child, never by callers
    rows_path: str = ""  # the train-split rows, sealed columns removed
    env: dict | None = None  # multi-turn domains: the sealed tool environment that env.py may narrow


def child_dir(spec: TrainSpec) -> Path:
    """The one directory a training child may write: TRL's resumable state, raw evidence, the final policy."""
    return Path(spec.out_dir) / "child"


def grpo_config(spec: TrainSpec, trainer_knobs: dict, reward_weights: list[float]):
    """The harness's knobs plus what the backend owns (paths, device, logging, seed)."""
    from trl import GRPOConfig

    from evotrainer.trainer.harness import TRAINER_DEFAULTS

    knobs = {**TRAINER_DEFAULTS, **trainer_knobs}
    gpu = spec.device == "cuda"
    # on a GPU: bf16, and generation by vLLM inside the training process where asked (colocate: no second server)
    vllm = dict(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3) if spec.use_vllm else {}
    return GRPOConfig(
        output_dir=str(child_dir(spec) / "trl"), max_steps=spec.horizon or spec.steps, seed=spec.seed,
        data_seed=spec.seed, **vllm,
        use_cpu=not gpu, bf16=gpu, activation_checkpointing=False, report_to=["tensorboard"], logging_steps=1,
        **({"ddp_backend": "nccl" if gpu else "gloo"} if spec.processes > 1 else {}),  # never MPI, even where built
        save_strategy="steps", save_steps=spec.save_every, save_total_limit=1, disable_tqdm=True,
        dataloader_num_workers=0, log_completions=False, reward_weights=reward_weights, **knobs,
    )


def training_rows(rows: list[dict], harness_filters: list) -> list[dict]:
    """The dataset rows one training run sees: the parent's train rows after the harness's filters. A filter may
    drop, reorder or repeat rows, never change or invent one (DESIGN §5)."""
    known = {json.dumps(r, sort_keys=True) for r in rows}
    for f in harness_filters:
        rows = f(rows)
        if not isinstance(rows, list):
            raise ValueError(f"filter {f.__name__!r} returned {type(rows).__name__}, not a list of rows")
        for r in rows:
            if not isinstance(r, dict) or json.dumps(r, sort_keys=True, default=repr) not in known:
                what = r.get("prompt_id") if isinstance(r, dict) else type(r).__name__
                raise ValueError(f"filter {f.__name__!r} returned a row that is not an unmodified train row "
                                 f"({what!r}): filters may drop, reorder or repeat tasks, never change or add one")
    if not rows:
        raise ValueError("the harness's filters removed every training prompt")
    return rows


def make_trainer_class():
    """Defined lazily so that importing this module does not import torch/TRL (the CLI imports TrainSpec)."""
    import torch
    from trl import GRPOTrainer

    class EvidenceGRPOTrainer(GRPOTrainer):
        """GRPOTrainer that records every rollout of every training step (ungraded: the parent grades)."""

        def __init__(self, *args, evidence: EvidenceWriter, spec: TrainSpec, group_filters=(), **kwargs):
            super().__init__(*args, **kwargs)
            self.evidence, self.spec = evidence, spec
            self.group_filters = list(group_filters)
            self._last_rewards = None
            self._awaiting_logps: list[dict] = []  # this generation's rows, until the loss computes their logps
            self._loss_inputs = None
            self._unwritten: list[list[dict]] = []  # this rank's rows since the last flush, one list a generation

        def flush_evidence(self) -> None:
            """Every rank's rows since the last flush written by rank 0, in batch order (every rank calls this):
            generation by generation, and within one the ranks' slices in rank order, which is the batch's."""
            pending, self._unwritten = self._unwritten, []
            ranks = self.accelerator.num_processes
            if ranks > 1:
                from accelerate.utils import gather_object

                parts = gather_object(pending)  # rank 0's generations, then rank 1's, ...: as many on every rank
                pending = [[r for k in range(ranks) for r in parts[k * len(pending) + g]] for g in range(len(pending))]
            rows = [r for generation in pending for r in generation]
            if self.accelerator.is_main_process:
                self.evidence.add_rollouts(rows)
                self.evidence.flush(self.state.global_step)

        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            self._last_rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            self._last_ids = completion_ids_list  # unpadded: the only place a generated pad token is visible
            return self._last_rewards

        def _save_checkpoint(self, model, trial):
            # evidence on disk never runs ahead of a resumable state, nor behind it: flush, then save
            self.flush_evidence()
            return super()._save_checkpoint(model, trial)

        def _generate_and_score_completions(self, inputs):
            self.current_inputs = inputs  # the rows a multi-turn rollout_func needs (it is handed prompts only)
            out = super()._generate_and_score_completions(inputs)
            if self.model.training:
                rows = self._rows(inputs, out)
                if self.group_filters:
                    self._apply_group_filters(rows, out)
                self._unwritten.append(rows)
                if out.get("old_per_token_logps") is None:
                    # on-policy: the loss computes exactly these log-probabilities next; take them from there
                    # instead of a second forward pass (which cost ~15% of a step). The index follows TRL's
                    # shuffle and split of the batch.
                    self._awaiting_logps = rows
                    out["evidence_index"] = torch.arange(len(rows), device=out["completion_ids"].device)
            return out

        def _apply_group_filters(self, rows: list[dict], out: dict) -> None:
            """Dynamic sampling without refill: groups a filter drops leave the loss (mask zeroed), and the
            token count that normalises dapo/bnpo-style losses is recounted over every rank, so kept groups carry
            the step. The filters see whole groups: with several ranks, rank 0 gathers the batch, runs them once
            and sends each rank the verdicts."""
            from accelerate.utils import broadcast_object_list, gather_object

            from evotrainer.trainer.harness import keep_groups

            g, ranks = self.num_generations, self.accelerator.num_processes
            everyone = gather_object(rows) if ranks > 1 else rows
            keep = [None]
            if self.accelerator.is_main_process:
                keep = [keep_groups(self.group_filters, [everyone[i:i + g] for i in range(0, len(everyone), g)])]
            if ranks > 1:
                broadcast_object_list(keep)
            offset = self.accelerator.process_index * len(rows)
            drop = [not keep[0][(offset + i) // g] for i in range(len(rows))]
            dropped = torch.tensor(drop, device=out["completion_mask"].device)
            out["completion_mask"] = out["completion_mask"] * (~dropped).unsqueeze(1).int()
            loss_mask = out["completion_mask"] * out["tool_mask"] if out.get("tool_mask") is not None \
                else out["completion_mask"]
            out["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum().to(
                out["num_items_in_batch"].dtype)
            for row, d in zip(rows, drop):
                row["loss_masked"] = row["loss_masked"] or d

        def _compute_loss(self, model, inputs):
            self._loss_inputs = inputs if "evidence_index" in inputs else None
            return super()._compute_loss(model, inputs)

        def _get_per_token_logps_and_entropies(self, *args, **kwargs):
            result = super()._get_per_token_logps_and_entropies(*args, **kwargs)
            inputs, self._loss_inputs = self._loss_inputs, None
            if inputs is not None and torch.is_grad_enabled():
                mask = inputs["completion_mask"].float()
                if "tool_mask" in inputs:
                    mask = mask * inputs["tool_mask"]
                mean = ((result[0].detach() * mask).sum(1) / mask.sum(1).clamp(min=1)).tolist()
                for idx, value, n in zip(inputs["evidence_index"].tolist(), mean, mask.sum(1).tolist()):
                    # a completion masked out of the loss has no log-probability here: NaN, not a made-up 0
                    self._awaiting_logps[idx]["mean_logprob"] = value if n > 0 else float("nan")
            return result

        def _rows(self, inputs: list[dict], out: dict) -> list[dict]:
            ids, adv = out["completion_ids"], out["advantages"]
            stop = {*self.eos_token_ids, self._tokenizer.pad_token_id}
            # TRL's definition: truncated when the last generated token is neither EOS nor padding
            truncated = [not c or c[-1] not in stop for c in self._last_ids]
            lengths = [len(c) for c in self._last_ids]
            positions = torch.arange(ids.size(1), device=ids.device).unsqueeze(0)
            real = (positions < torch.tensor(lengths, device=ids.device).unsqueeze(1)).int()
            logps = out.get("old_per_token_logps")  # None when on-policy: filled in from the loss, see above
            if logps is not None:
                lp_l = ((logps * real).sum(1) / real.sum(1).clamp(min=1)).tolist()
            else:
                lp_l = [float("nan")] * ids.size(0)
            rewards = self._last_rewards  # the whole batch's (TRL gathers them): this rank's rows start at `offset`
            offset = self.accelerator.process_index * len(inputs)
            weights = self.reward_weights.to(rewards.device)
            total = (rewards * weights).nansum(dim=1)
            texts = self._tokenizer.batch_decode(ids, skip_special_tokens=True)
            # tensors to Python lists once: per-element float() on tensors costs more than the rest of a row
            masked = (out["completion_mask"].sum(1) == 0).tolist()
            adv_l, total_l = adv.tolist(), total.tolist()
            comp_l = rewards.tolist()
            step, g, s = self.state.global_step + 1, self.num_generations, self.spec
            rows = []
            for i, x in enumerate(inputs):
                at = offset + i  # place in the step's batch
                group = f"{step}:{at // g}"
                tag = f"{s.evidence_tag}/" if s.evidence_tag else ""
                row = {
                    "rollout_id": f"{s.run}/g{s.generation}/{s.branch}/{tag}{group}:{at % g}",
                    "run": s.run, "generation": s.generation, "branch": s.branch,
                    "harness_commit": s.harness_commit, "checkpoint": s.checkpoint_id, "step": step,
                    "prompt_id": x["prompt_id"], "group_id": group, "sample_idx": at % g,
                    "difficulty": x.get("difficulty", 0), "prompt": x.get("task_prompt", x["prompt"]),
                    "completion": texts[i], "completion_ids": self._last_ids[i],
                    "task": json.dumps({k: v for k, v in x.items() if k not in ("prompt", "prompt_id", "task_prompt")}),
                    "n_tokens": lengths[i], "truncated": truncated[i],
                    "reward": total_l[at], "advantage": adv_l[i], "loss_masked": masked[i],
                    "correct": None, "formatted": None,  # sealed: filled in by the parent's grader
                    "mean_logprob": lp_l[i],
                }
                for j, name in enumerate(self.reward_func_names):
                    row[f"reward_{name}"] = comp_l[at][j]
                rows.append(row)
            return rows

    return EvidenceGRPOTrainer


def make_rollout_func(env_config, args):
    """TRL's `rollout_func` for a multi-turn domain: one episode per prompt it receives (each prompt already
    repeated `num_generations` times), observations masked through `env_mask`, and an `episode` column (how it
    ended, visible tests on the final repository) forwarded to the reward functions."""
    from evotrainer.trainer.episodes import model_policy, run_episodes
    from evotrainer.trainer.swe_scripts import episode_info

    def rollout(prompts: list, trainer) -> dict:
        rows = trainer.current_inputs
        if [r["prompt"] for r in rows] != list(prompts):
            raise RuntimeError("rollout_func received prompts that are not the current batch's rows")
        act = model_policy(trainer.model, trainer.processing_class, temperature=args.temperature,
                           top_p=args.top_p, seed=None, keep_cache=True)
        outs = run_episodes(act, trainer.processing_class, rows, env_config)
        return {"prompt_ids": [o.prompt_ids for o in outs], "completion_ids": [o.completion_ids for o in outs],
                "logprobs": [o.logprobs for o in outs], "env_mask": [o.env_mask for o in outs],
                "episode": episode_info(outs)}
    return rollout


def train(spec: TrainSpec) -> dict | None:
    """Run the GRPO training described by `spec`; resumes from its own last checkpoint if one exists. With several
    ranks every rank runs this, and only rank 0 writes the evidence and the policy and returns the result."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback

    from evotrainer.trainer.harness import (
        load_env_config,
        load_filters,
        load_group_filters,
        load_reward_functions,
        load_spec,
    )
    from evotrainer.trainer.policy import format_prompts, load_policy

    torch.set_num_threads(int(os.environ.get("EVOTRAINER_TORCH_THREADS", "1")))
    started = time.time()
    rank = int(os.environ.get("RANK", "0"))  # torchrun's; 0 in a single process
    out = child_dir(spec)
    # TRL's training curves (train/reward, train/kl, ...) under the child's directory; the parent keeps them under the
    # job's out_dir (jobs.keep_curves), so that `tensorboard --logdir RUN` shows every arm of a run side by side
    os.environ["TENSORBOARD_LOGGING_DIR"] = str(out / "tensorboard")
    hspec = load_spec(spec.harness_dir, spec.processes)
    reward_funcs = load_reward_functions(spec.harness_dir, hspec)
    model, tokenizer = load_policy(spec.checkpoint)
    model.train()
    args = grpo_config(spec, hspec.trainer, [r.weight for r in hspec.rewards])
    rows = training_rows(json.loads(Path(spec.rows_path).read_text()), load_filters(spec.harness_dir, hspec))

    evidence = EvidenceWriter(out / "evidence", spec.generation, spec.branch, spec.evidence_tag)
    trl_dir = Path(args.output_dir)
    start_step = state_step(spec.resume_state) if spec.resume_state else 0
    stop_at = start_step + spec.steps
    if args.max_steps < stop_at:
        raise ValueError(f"the line's horizon ({args.max_steps} steps) ends before this job's last step ({stop_at})")
    with args.main_process_first(desc="the checkpoint to resume from"):  # rank 0 copies a kept state, then the rest
        done = sorted(trl_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
        if not done and spec.resume_state:  # the line's previous job kept its state: continue from it
            done = [_continue_from(Path(spec.resume_state), trl_dir / f"checkpoint-{start_step}",
                                   spec.fresh_optimizer)]
        if rank == 0:
            evidence.truncate_after(int(done[-1].name.split("-")[1]) if done else 0)
    resume = str(done[-1]) if done else None

    class UpdateSize(TrainerCallback):
        """How far each optimizer step moves the weights relative to their size, ||dw|| / ||w|| (the step evidence's
        `update_ratio`): the learning rate as the weights feel it. On a large model a strided subset of the tensors
        (about 4M values) is copied, not the whole."""

        ratio: float | None = None

        def on_pre_optimizer_step(self, args_, state, control, model=None, **kw):
            params = [p for p in model.parameters() if p.requires_grad]
            stride = 1 + sum(p.numel() for p in params) // 4_000_000
            self.before = [(p, p.detach().clone()) for p in params[::stride]]

        def on_optimizer_step(self, args_, state, control, **kw):
            moved = sum(float((p.detach() - b).float().pow(2).sum()) for p, b in self.before)
            size = sum(float(b.float().pow(2).sum()) for _, b in self.before)
            self.ratio, self.before = (moved / size) ** 0.5 if size > 0 else None, []

    update = UpdateSize()

    class Capture(TrainerCallback):
        def on_log(self, args_, state, control, logs=None, **kw):
            if logs and "reward" in logs and state.is_world_process_zero:  # TRL's logs are every rank's already
                row = {"step": state.global_step, "generation": spec.generation, "branch": spec.branch}
                if update.ratio is not None:
                    row["update_ratio"] = update.ratio
                row.update({ours: float(logs[theirs]) for theirs, ours in STEP_METRICS.items() if theirs in logs})
                row.update({k.replace("rewards/", "reward_").replace("/mean", ""): float(v) for k, v in logs.items()
                            if k.startswith("rewards/") and k.endswith("/mean")})
                evidence.add_step(row)
                progress(phase="train", step=state.global_step - start_step, total=spec.steps,
                         reward=row.get("reward"))

    class Segment(TrainerCallback):
        """This job's part of the line: a replicate reseeds sampling at its first step (after TRL restored the
        line's RNG), and training stops at `stop_at` with the state saved for the next job."""

        def on_step_begin(self, args_, state, control, **kw):
            if spec.reseed is not None and state.global_step == start_step:
                import random

                import numpy as np

                value = 1_000_003 * (spec.reseed + 1) + start_step + 7919 * rank  # each rank its own samples
                random.seed(value)
                np.random.seed(value % 2**32)
                torch.manual_seed(value)

        def on_step_end(self, args_, state, control, **kw):
            if state.global_step >= stop_at:
                control.should_training_stop = True
                control.should_save = control.should_save or spec.keep_state

    multi_turn = {}
    if spec.env is None:  # a pretrained instruct model sees each prompt in its chat template (policy.format_prompts);
        # the evidence keeps the task's own prompt (`task_prompt`), which the parent checks against the train split
        rows = [{**r, "prompt": p, "task_prompt": r["prompt"]} if p != r["prompt"] else r
                for r, p in zip(rows, format_prompts(tokenizer, [r["prompt"] for r in rows]))]
    else:  # episodes in the harness's tool environment (env.py)
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        multi_turn["rollout_func"] = make_rollout_func(load_env_config(spec.harness_dir, spec.env), args)
    trainer_cls = make_trainer_class()
    trainer = trainer_cls(model=model, reward_funcs=reward_funcs, args=args, train_dataset=Dataset.from_list(rows),
                          processing_class=tokenizer, callbacks=[update, Capture(), Segment()], evidence=evidence,
                          spec=spec, group_filters=load_group_filters(spec.harness_dir, hspec),
                          **multi_turn)
    trainer.train(resume_from_checkpoint=resume)
    trainer.flush_evidence()  # what was logged after the last checkpoint

    final = out / "final"
    if rank == 0:
        shutil.rmtree(final, ignore_errors=True)
    trainer.save_model(str(final))  # every rank takes part, rank 0 writes
    trainer.accelerator.wait_for_everyone()  # every rank's checkpoint files are written
    if rank != 0:
        return None
    tokenizer.save_pretrained(str(final))
    logged = [h for h in trainer.state.log_history if "reward" in h and h.get("step", 0) > start_step]
    step = trainer.state.global_step
    if spec.keep_state:  # the next job of the line continues from here
        kept = trl_dir / f"checkpoint-{step}"
        if not (kept / "trainer_state.json").is_file():
            raise RuntimeError(f"training stopped at step {step} without saving its state")
        shutil.rmtree(out / "state", ignore_errors=True)
        os.replace(kept, out / "state")
    shutil.rmtree(trl_dir, ignore_errors=True)  # resumable state is no longer needed
    return {  # the parent (jobs.train) adds what it knows itself and writes the checkpoint's meta.json
        "steps": step - start_step, "global_step": step, "resumed_from": resume,
        "seconds": round(time.time() - started, 1),
        "metrics": {
            "train_reward_first": logged[0]["reward"] if logged else None,
            "train_reward_last": logged[-1]["reward"] if logged else None,
            "frac_zero_std_mean": sum(h.get("frac_reward_zero_std", 0) for h in logged) / max(len(logged), 1),
        },
    }


OPTIMIZER_STATE = ("optimizer.pt", "scheduler.pt")


def state_step(state_dir: str | Path) -> int:
    """The global step a kept trainer state is at."""
    return int(json.loads((Path(state_dir) / "trainer_state.json").read_text())["global_step"])


def _continue_from(state: Path, dest: Path, fresh_optimizer: bool) -> Path:
    """A copy of the line's kept state as this job's first TRL checkpoint (the kept one stays read-only); without
    the optimizer and scheduler when an optimizer setting changed (TRL then builds them anew from the new knobs)."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for p in state.iterdir():
        if p.is_file() and not p.is_symlink() and not (fresh_optimizer and p.name in OPTIMIZER_STATE):
            shutil.copy2(p, dest / p.name)
    return dest


def launch_ranks(spec: TrainSpec, argv: list[str]) -> int:
    """This module again in `spec.processes` ranks under torchrun (on one machine: its own rendezvous on a free port
    of the loopback), inside this process's sandbox, so the ranks die with it. Ranks read torchrun's environment
    (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT) through accelerate, as under `accelerate launch`: gloo on the CPU,
    NCCL and a GPU each on cuda. A failed rank stops the others; its traceback is in this child's log."""
    import signal

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    try:  # the store and the ranks on the loopback: the sandbox's network namespace has nothing else
        run(parse_args(["--standalone", "--local-addr", "127.0.0.1", "--nproc-per-node", str(spec.processes),
                        "--module", "evotrainer.trainer.grpo", *argv]))
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        message = failure.message.get("message", "") if isinstance(failure.message, dict) else failure.message
        print(e.format_msg(), file=sys.stderr)
        # last, the root cause alone (the parent's one-line message reads the log's last exception line)
        print(f"training rank {rank} failed first:\n{str(message).strip().splitlines()[-1] if message else ''}",
              file=sys.stderr, flush=True)
        if failure.exitcode < 0:  # killed by a signal (the memory limit, a crash): end the same way, so says the parent
            signal.signal(-failure.exitcode, signal.SIG_DFL)
            os.kill(os.getpid(), -failure.exitcode)
        return failure.exitcode or 1
    return 0


def _rank_main(spec: TrainSpec) -> int:
    """One rank under torchrun: dies with the launcher even without a sandbox around them (torchrun starts each rank
    in its own session), and records its exception where torchrun reads a failed rank's root cause."""
    from torch.distributed.elastic.multiprocessing.errors import record

    from evotrainer.trainer.sandbox import _die_with_parent

    _die_with_parent(os.getppid())
    return record(_one_process)(spec)


def main(argv: list[str]) -> int:
    spec = TrainSpec.model_validate_json(Path(argv[0]).read_text())
    if spec.processes > 1:
        return _rank_main(spec) if "LOCAL_RANK" in os.environ else launch_ranks(spec, argv)
    return _one_process(spec)


def _one_process(spec: TrainSpec) -> int:
    result = train(spec)
    if result is not None:
        (child_dir(spec) / "result.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
