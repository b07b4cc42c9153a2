"""Rollout evidence: one Parquet row per rollout, per-step aggregates beside it (DESIGN §6).

Layout under an evidence root:

    evidence/g<generation>/<branch>/rollouts-<last step>.parquet   one row per completion
    evidence/g<generation>/<branch>/steps-<last step>.parquet      one row per optimizer step

A writer may carry a tag (a backtest's seed, `s1`): its chunks are named `rollouts-s1-<step>.parquet`, so
several runs of one branch (seeds of a short-run backtest) keep their own chunks side by side.

Files are written in chunks that end where a training checkpoint is saved, so an interrupted
run that resumes from checkpoint S drops the chunks after S (`truncate_after`) and rewrites them
identically. `read_rollouts` / `read_steps` are the one way to read evidence back.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from evotrainer.base.errors import UserError

# The fixed columns of a rollout row; reward_<component> columns are added per harness, and
# multi-turn domains add turns, tool_calls, tool_errors, transcript.
ROLLOUT_SCHEMA = pa.schema([
    ("rollout_id", pa.string()),
    ("run", pa.string()),
    ("generation", pa.int32()),
    ("branch", pa.string()),
    ("harness_commit", pa.string()),
    ("checkpoint", pa.string()),
    ("step", pa.int32()),
    ("prompt_id", pa.string()),
    ("group_id", pa.string()),
    ("sample_idx", pa.int16()),
    ("difficulty", pa.int16()),
    ("prompt", pa.string()),
    ("completion", pa.string()),
    ("completion_ids", pa.list_(pa.int32())),  # the generated token ids, for rewards that read them on replay
    ("task", pa.string()),  # JSON: the dataset columns the reward functions received (answer, fmt, ...)
    ("n_tokens", pa.int32()),
    ("truncated", pa.bool_()),
    ("reward", pa.float32()),
    ("advantage", pa.float32()),
    ("loss_masked", pa.bool_()),
    ("correct", pa.bool_()),
    ("formatted", pa.bool_()),  # the sealed parser could read a final answer
    ("mean_logprob", pa.float32()),
])

# Per-step aggregates, renamed from TRL's logged metric names to stable ones.
STEP_METRICS = {
    "reward": "reward",
    "reward_std": "reward_std",
    "frac_reward_zero_std": "frac_zero_std",
    "entropy": "entropy",
    "kl": "kl",
    "grad_norm": "grad_norm",
    "loss": "loss",
    "learning_rate": "learning_rate",
    "clip_ratio/region_mean": "clip_ratio",
    "clip_ratio/low_mean": "clip_ratio_low",
    "clip_ratio/high_mean": "clip_ratio_high",
    "completions/mean_length": "mean_length",
    "completions/clipped_ratio": "truncated_ratio",
}


def branch_dir(branch: str) -> str:
    """A branch name as a single path component (`cand/g1-x` -> `cand--g1-x`)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "--", branch)


class EvidenceWriter:
    """Buffers rows of one (generation, branch) and writes them as a chunk on `flush(last_step)`."""

    def __init__(self, root: str | Path, generation: int, branch: str, tag: str = ""):
        self.dir = Path(root) / f"g{generation}" / branch_dir(branch)
        self.prefix = f"{branch_dir(tag)}-" if tag else ""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rollouts: list[dict] = []
        self.steps: list[dict] = []

    def add_rollouts(self, rows: list[dict]) -> None:
        self.rollouts.extend(rows)

    def add_step(self, row: dict) -> None:
        self.steps.append(row)

    def flush(self, last_step: int) -> None:
        """Write buffered rows atomically (temp file, then rename): a crash never leaves half a chunk."""
        for name, rows in (("rollouts", self.rollouts), ("steps", self.steps)):
            if not rows:
                continue
            table = pa.Table.from_pylist(rows)
            if name == "rollouts":
                table = _conform(table)
            path = self.dir / f"{name}-{self.prefix}{last_step:07d}.parquet"
            if path.exists():
                raise FileExistsError(f"evidence chunk {path} already written: chunks never overwrite each other")
            tmp = path.with_suffix(".tmp")
            pq.write_table(table, tmp)
            os.replace(tmp, path)
            rows.clear()

    def truncate_after(self, step: int) -> None:
        """Drop this writer's chunks that end after `step` (regenerated when a run resumes from `step`)."""
        for kind in ("rollouts", "steps"):
            for path in self.dir.glob(f"{kind}-{self.prefix}[0-9]*.parquet"):
                if int(path.stem.rsplit("-", 1)[1]) > step:
                    path.unlink()
            for path in self.dir.glob(f"{kind}-{self.prefix}[0-9]*.tmp"):
                path.unlink()


def _conform(table: pa.Table) -> pa.Table:
    """Cast the fixed columns to ROLLOUT_SCHEMA's types, keep extra (reward_*, multi-turn) columns after them."""
    missing = [f.name for f in ROLLOUT_SCHEMA if f.name not in table.column_names]
    if missing:
        raise ValueError(f"rollout rows lack columns {missing}")
    fixed = [table.column(f.name).cast(f.type) for f in ROLLOUT_SCHEMA]
    extra = [n for n in table.column_names if n not in ROLLOUT_SCHEMA.names]
    return pa.table(fixed + [table.column(n) for n in extra], names=ROLLOUT_SCHEMA.names + extra)


def _read(root: str | Path, kind: str, generation: int | None, branch: str | None,
          tag: str | list[str] | None = None) -> pa.Table:
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"evidence directory {root} does not exist: pass a run's evidence/ folder")
    gen_glob = f"g{generation}" if generation is not None else "g*"
    br_glob = branch_dir(branch) if branch is not None else "*"
    if isinstance(tag, list | tuple):  # exact writer tags: `abc-s1-k5` must not read `abc-s1-k50`
        files = sorted(f for t in tag for f in root.glob(f"{gen_glob}/{br_glob}/{kind}-{branch_dir(t)}-*.parquet")
                       if f.stem.removeprefix(f"{kind}-{branch_dir(t)}-").isdigit())
    else:
        files = sorted(root.glob(f"{gen_glob}/{br_glob}/{kind}-{branch_dir(tag) if tag else ''}*.parquet"))
    if not files:
        return pa.table({}) if kind == "steps" else ROLLOUT_SCHEMA.empty_table()
    tables = []
    for f in files:
        try:
            tables.append(pq.read_table(f))
        except (pa.ArrowInvalid, OSError) as e:
            raise UserError(f"evidence file {f} is corrupt ({e}): delete it and re-run the step range it held") from e
    return pa.concat_tables(tables, promote_options="permissive")


def read_rollouts(root: str | Path, generation: int | None = None, branch: str | None = None,
                  tag: str | list[str] | None = None) -> pa.Table:
    """All rollout rows under an evidence root, optionally of one generation, branch and writer tag (a string is a
    prefix: `abc123` reads the chunks of every tag that starts with it; a list names exact tags)."""
    return _read(root, "rollouts", generation, branch, tag)


def read_steps(root: str | Path, generation: int | None = None, branch: str | None = None,
               tag: str | list[str] | None = None) -> pa.Table:
    """All per-step aggregate rows under an evidence root."""
    return _read(root, "steps", generation, branch, tag)


def adopt(root: str | Path, generation: int, src_branch: str, tag: str, dst_branch: str) -> int:
    """Re-file the chunks one writer (`src_branch`, exact `tag`) wrote as `dst_branch`'s own (untagged), with the
    branch and rollout ids of the rows rewritten: a run that is the next segment of another line (the loop's
    control arm of seed 0 is the champion's next segment) becomes that line's evidence without training again.
    Idempotent: `dst_branch`'s untagged chunks are replaced. Returns the number of rollouts adopted."""
    root = Path(root)
    src = root / f"g{generation}" / branch_dir(src_branch)
    dest = EvidenceWriter(root, generation, dst_branch)
    dest.truncate_after(0)
    n = 0
    for kind in ("steps", "rollouts"):
        for path in sorted(src.glob(f"{kind}-{branch_dir(tag)}-*.parquet")):
            step = path.stem.removeprefix(f"{kind}-{branch_dir(tag)}-")
            if not step.isdigit():
                continue  # another tag that starts with this one
            rows = pq.read_table(path).to_pylist()
            for r in rows:
                r["branch"] = dst_branch
                if kind == "rollouts":
                    r["rollout_id"] = r["rollout_id"].replace(f"/{src_branch}/{tag}/", f"/{dst_branch}/", 1)
            if kind == "rollouts":
                dest.add_rollouts(rows)
                n += len(rows)
            else:
                for r in rows:
                    dest.add_step(r)
            dest.flush(int(step))
    return n
