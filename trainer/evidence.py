"""Rollout evidence: one Parquet row per rollout, per-step aggregates beside it (DESIGN §6).

Layout under an evidence root:

    evidence/g<generation>/<branch>/rollouts-<last step>.parquet   one row per completion
    evidence/g<generation>/<branch>/steps-<last step>.parquet      one row per optimizer step

A writer may carry a tag (a backtest's seed, `s1`): its chunks are named `rollouts-s1-<step>.parquet`, so
several runs of one branch (seeds of a short-run backtest) keep their own chunks side by side.

Files are written in chunks that end where a training checkpoint is saved, so an interrupted
run that resumes from checkpoint S drops the chunks after S (`truncate_after`) and rewrites them
identically. `read_rollouts` / `read_steps` are the one way to read evidence back.

Every column is described in the schemas below, and the files carry the descriptions (field metadata); the
`generation` field says how generations are numbered. `python -m evotrainer.trainer.evidence --markdown` prints
them as the tables of the README and docs/architecture.md.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from evotrainer.base.errors import UserError

DESCRIPTION = b"description"  # the key of each field's description in the Parquet schema's field metadata
COMPONENT = "reward_<component>"  # one column per reward function of the harness, named after the function


def _field(name: str, type_: pa.DataType, description: str) -> pa.Field:
    return pa.field(name, type_, metadata={DESCRIPTION: description.encode()})


# Read by a data person as the files' own documentation (pyarrow field metadata) and rendered into the README and
# docs/architecture.md by `python -m evotrainer.trainer.evidence --write README.md docs/architecture.md`.
ROLLOUT_SCHEMA = pa.schema([
    _field("rollout_id", pa.string(), "`<run>/g<generation>/<branch>/[<tag>/]<group_id>:<sample_idx>`; the tag "
           "names a backtest arm (`<commit8>-s<seed>-k<steps>`)"),
    _field("run", pa.string(), "the run directory's name (`evotrainer train`: the `--out` folder's)"),
    _field("generation", pa.int32(), "the evidence folder `g<generation>`. In the loop, `g<k>/main` is the champion "
           "line trained under the harness that came out of generation k (generation 1's champion training is "
           "stored under `g0`, generation 2's under `g1`), and `g<k>/<candidate>` and `g<k>/control` are "
           "generation k's short-run backtest arms; `evotrainer train` writes `g0/main`"),
    _field("branch", pa.string(), "the harness branch trained: `main` (the champion line), a candidate "
           "(`cand/g<k>-<name>`) or `control` (a backtest's control arms, on the champion harness)"),
    _field("harness_commit", pa.string(), "the harness commit trained under; empty when the harness directory is "
           "not the root of a git repository (`evotrainer train` on a domain's template or a plain folder); compare's "
           "recipe arms write `static:<arm>` or `hpo:t<trial>`"),
    _field("checkpoint", pa.string(), "the id of the checkpoint this training job produces, not the one it started "
           "from (that is `parent` in the produced checkpoint's meta.json): `policy` in the loop, its backtests and "
           "compare, `<domain>-s<seed>-<steps>steps` for `evotrainer train`"),
    _field("step", pa.int32(), "the optimizer step this completion was generated for, counted along the training "
           "line (a job that continues a line goes on from its step); with `num_iterations` > 1 the same rollouts "
           "feed the following steps too"),
    _field("prompt_id", pa.string(), "the task's id in the domain's train split"),
    _field("group_id", pa.string(), "`<step>:<index of the prompt in the step's batch>` (the whole batch, every "
           "rank's): the `num_generations` completions of one prompt, whose rewards make each other's advantages"),
    _field("sample_idx", pa.int16(), "the completion's index within its group"),
    _field("difficulty", pa.int16(), "the task's level in its domain"),
    _field("prompt", pa.string(), "the prompt text"),
    _field("completion", pa.string(), "the generated text, special tokens removed (multi-turn: the whole episode "
           "after the prompt, observations included)"),
    _field("completion_ids", pa.list_(pa.int32()), "the generated token ids, unpadded (EOS included when "
           "generated), for rewards that read them on replay"),
    _field("task", pa.string(), "JSON: the dataset columns the reward functions received besides prompt and "
           "prompt_id (`difficulty`, `fmt`, the domain's own such as code's `visible`, and what a multi-turn "
           "rollout forwarded, such as swe's `episode`); never a sealed column such as `answer`"),
    _field("n_tokens", pa.int32(), "the number of tokens in `completion_ids` (multi-turn: observations included)"),
    _field("truncated", pa.bool_(), "the last generated token is neither EOS nor padding (TRL's definition)"),
    _field("reward", pa.float32(), "the weighted sum of the harness's reward components (a component that "
           "returned None counts 0)"),
    _field("advantage", pa.float32(), "the advantage TRL's loss used: the reward minus its group's mean, divided "
           "by the group's (or, with `scale_rewards: batch`, the batch's) standard deviation + 1e-4 unless "
           "`scale_rewards: none` (`multi_objective_aggregation: normalize_then_sum` normalises each component "
           "first)"),
    _field("loss_masked", pa.bool_(), "no token of the completion reached the loss (`mask_truncated_completions`, "
           "or a harness group filter dropped its group)"),
    _field("correct", pa.bool_(), "the sealed scorer's verdict, computed by the parent process, never by harness "
           "code: a floor reward that shaped rewards are checked against"),
    _field("formatted", pa.bool_(), "the sealed parser could read a final answer (code: a program; swe: a "
           "submitted episode)"),
    _field("mean_logprob", pa.float32(), "mean log-probability of the completion's tokens under the policy that "
           "sampled it, at the sampling temperature; NaN when the completion was masked out of an on-policy loss"),
])

# Columns a domain's sealed grader adds to its rollouts (the domain's `evidence_columns`).
DOMAIN_SCHEMA = pa.schema([
    _field("exec_status", pa.string(), "code: the program's sandbox status (`ok`, `syntax_error` (also a "
           "completion that is not one expression: never run), `runtime_error` (a failed check too), `timeout`, "
           "`memory`, `forbidden`, `early_exit`, `crash`)"),
    _field("visible_pass", pa.float64(), "code: the fraction of the visible examples the program answers right "
           "(NaN on HumanEval)"),
    _field("hidden_pass", pa.float64(), "code: the fraction of the hidden tests it passes (HumanEval: 1.0 when "
           "the check passed)"),
    _field("turns", pa.int64(), "swe: actions taken"),
    _field("tool_calls", pa.int64(), "swe: actions naming a known tool"),
    _field("tool_errors", pa.int64(), "swe: actions answered with an `error:` observation or naming no tool"),
    _field("actions", pa.string(), "swe: JSON list of `[tool, argument, error]` per action (`?` for no tool)"),
    _field("edits", pa.int64(), "swe: edits applied to the repository"),
    _field("submitted", pa.bool_(), "swe: the episode ended with an accepted `submit`"),
    _field("end", pa.string(), "swe: how the episode ended: `submit`, `turn_limit` or `context`"),
    _field("tested_after_edit", pa.bool_(), "swe: a `test` action ran after the last applied edit"),
    _field("leak_calls", pa.int64(), "swe: successful calls of tools the sealed environment lacks (`history`)"),
    _field("transcript", pa.string(), "swe: the episode text the columns above are read from (the completion)"),
])

STEP_SCHEMA = pa.schema([
    _field("step", pa.int64(), "the optimizer step just taken, counted along the training line (the rollouts of "
           "the same `step` fed it)"),
    _field("generation", pa.int64(), "as in the rollouts"),
    _field("branch", pa.string(), "as in the rollouts"),
    _field("update_ratio", pa.float64(), "norm(w_after - w_before) / norm(w_before) of the step's update (a strided "
           "subset of the tensors of a model over 4M parameters)"),
    _field("reward", pa.float64(), "mean total reward over the step's batch"),
    _field("reward_std", pa.float64(), "standard deviation of the total reward over the step's whole batch, all "
           "groups pooled (TRL's `reward_std`), not within groups: `frac_zero_std` measures the groups"),
    _field("frac_zero_std", pa.float64(), "fraction of completions whose group's rewards are all equal (no "
           "advantage); with `scale_rewards: batch` TRL tests the batch's spread instead, so 0 or 1"),
    _field("entropy", pa.float64(), "mean token entropy of the policy over the completion tokens in the loss"),
    _field("kl", pa.float64(), "mean per-token KL to the reference policy; only when the harness sets `beta` "
           "above 0 (the templates use 0: no column)"),
    _field("grad_norm", pa.float64(), "gradient norm before clipping"),
    _field("loss", pa.float64(), "the step's training loss"),
    _field("learning_rate", pa.float64(), "the learning rate of the step"),
    _field("clip_ratio", pa.float64(), "fraction of loss tokens whose importance ratio was clipped, either side "
           "(loss types grpo, bnpo, dr_grpo, dapo, luspo only)"),
    _field("clip_ratio_low", pa.float64(), "as `clip_ratio`, below 1 - epsilon with a negative advantage"),
    _field("clip_ratio_high", pa.float64(), "as `clip_ratio`, above 1 + epsilon_high with a positive advantage"),
    _field("mean_length", pa.float64(), "mean completion length in tokens"),
    _field("truncated_ratio", pa.float64(), "fraction of completions truncated (as the rollouts' `truncated`)"),
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


def component_field(name: str, kind: str) -> pa.Field:
    """The field of a `reward_<component>` column of `kind` (rollouts or steps)."""
    what = "the value reward function `{}` gave, unweighted (NaN when it returned None)" if kind == "rollouts" else \
        "mean over the step's batch of reward function `{}`'s value, unweighted"
    return _field(name, pa.float64(), what.format(name.removeprefix("reward_")))


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
            names = list(dict.fromkeys(k for r in rows for k in r))  # every row's keys, not only the first row's
            table = pa.table({k: [r.get(k) for r in rows] for k in names})
            table = _conform(table) if name == "rollouts" else describe(table, "steps")
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
    """The fixed columns first, in ROLLOUT_SCHEMA's order and types, then the extra (reward_*, domain) columns."""
    missing = [f.name for f in ROLLOUT_SCHEMA if f.name not in table.column_names]
    if missing:
        raise ValueError(f"rollout rows lack columns {missing}")
    extra = [n for n in table.column_names if n not in ROLLOUT_SCHEMA.names]
    return describe(table.select(ROLLOUT_SCHEMA.names + extra), "rollouts")


def describe(table: pa.Table, kind: str, cast: bool = True) -> pa.Table:
    """`table` (rollouts or steps) with each documented column carrying its description and, with `cast`, cast to
    its documented type (without: a file written before keeps its own types); an unknown column goes undescribed."""
    known = {f.name: f for f in (ROLLOUT_SCHEMA if kind == "rollouts" else STEP_SCHEMA)}
    if kind == "rollouts":
        known.update({f.name: f for f in DOMAIN_SCHEMA})
    fields = []
    for own in table.schema:
        f = known.get(own.name) or (component_field(own.name, kind) if own.name.startswith("reward_") else own)
        fields.append(f if cast else f.with_type(own.type))
    return pa.Table.from_arrays([c.cast(f.type) for c, f in zip(table.columns, fields)], schema=pa.schema(fields))


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
    return describe(pa.concat_tables(tables, promote_options="permissive"), kind, cast=False)


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


# -- the schema as documentation ---------------------------------------------------------------------------------
BEGIN, END = "<!-- evidence-schema: generated by `python -m evotrainer.trainer.evidence --write` -->", \
    "<!-- /evidence-schema -->"


def _type(f: pa.Field) -> str:
    """Arrow's type name, spelt without its aliases (`float` is 32 bits, `double` 64)."""
    names = {pa.float32(): "float32", pa.float64(): "float64", pa.list_(pa.int32()): "list<int32>"}
    return f"`{names.get(f.type, str(f.type))}`"


def _table(fields: list[pa.Field], head: str = "| column | type | description |") -> list[str]:
    rows = [head, "|---|---|---|"]
    for f in fields:
        rows.append(f"| `{f.name}` | {_type(f)} | {f.metadata[DESCRIPTION].decode()} |")
    return rows


def schema_markdown() -> str:
    """The evidence schema as Markdown: the text between BEGIN and END in the README and docs/architecture.md."""
    from evotrainer.trainer.domains import DOMAINS, get_domain

    owners = {name: [d for d in DOMAINS if name in getattr(get_domain(d), "evidence_columns", ())]
              for name in DOMAIN_SCHEMA.names}
    domain_rows = ["| column | type | domain | description |", "|---|---|---|---|"]
    for f in DOMAIN_SCHEMA:
        what = f.metadata[DESCRIPTION].decode().split(": ", 1)[1]
        domain_rows.append(f"| `{f.name}` | {_type(f)} | {', '.join(owners[f.name])} | {what} |")
    lines = [
        "`evidence/g<generation>/<branch>/` (the branch as one path component: `cand/g1-x` is `cand--g1-x`) holds "
        "Parquet chunks cut where training checkpoints are saved: "
        "`rollouts-[<tag>-]<last step>.parquet`, one row per completion, and `steps-[<tag>-]<last step>.parquet`, "
        "one row per optimizer step (the tag names a backtest arm). Read them with "
        "`evotrainer.trainer.evidence.read_rollouts / read_steps`, or with any Parquet reader: each field carries "
        f"its description in the schema (field metadata, key `{DESCRIPTION.decode()}`).",
        "", "**Rollouts**", "", *_table([*ROLLOUT_SCHEMA, component_field(COMPONENT, "rollouts")]),
        "", "**Domain columns**, added to the rollouts by the domain's sealed grader", "", *domain_rows,
        "", "**Steps**", "", *_table([*STEP_SCHEMA, component_field(COMPONENT, "steps")]),
    ]
    return "\n".join(lines) + "\n"


def write_markdown(path: str | Path) -> bool:
    """Replace the text between BEGIN and END in `path` with `schema_markdown()`; True when it changed."""
    path = Path(path)
    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise UserError(f"{path} has no evidence schema block: add the lines {BEGIN} and {END} where it goes")
    head, rest = text.split(BEGIN, 1)
    new = f"{head}{BEGIN}\n{schema_markdown()}{END}{rest.split(END, 1)[1]}"
    if new != text:
        path.write_text(new)
    return new != text


if __name__ == "__main__":  # python -m evotrainer.trainer.evidence (--markdown | --write FILE...)
    import argparse

    parser = argparse.ArgumentParser(description="The evidence schema as Markdown.")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--markdown", action="store_true", help="print it")
    group.add_argument("--write", nargs="+", metavar="FILE", help="rewrite the generated block in each FILE")
    args = parser.parse_args()
    if args.markdown:
        print(schema_markdown(), end="")
    for file in args.write or ():
        print(f"{file}: {'updated' if write_markdown(file) else 'up to date'}")
