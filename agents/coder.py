"""Applying the Coder's edits to a candidate's files (search/replace blocks or whole files).

The same function serves the LLM Coder and the offline one. An edit that cannot be applied exactly is one
`EditFailed` sentence that goes back to the Coder as the error of its repair round. An intervention that names a
catalog transform is written by the catalog (`catalog_edits`), whichever policy planned it: the same files, byte
for byte.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from evotrainer.agents.offline.catalog import CATALOG, apply
from evotrainer.agents.schemas import CodeInput, CodeResult, Edit

# what a harness may contain (DESIGN §4); anything else is refused before it reaches the worktree
HARNESS_FILES = ("harness.yaml", "rewards.py", "filters.py", "env.py")
HARNESS_GLOBS = (*HARNESS_FILES, "diagnostics/*.py")


def harness_files(directory: Path) -> dict[str, str]:
    """The harness files an agent may read and edit, by relative path."""
    return {str(p.relative_to(directory)): p.read_text() for pattern in HARNESS_GLOBS
            for p in sorted(Path(directory).glob(pattern))}


class EditFailed(ValueError):
    pass


def check_path(path: str) -> str:
    p = PurePosixPath(path)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise EditFailed(f"{path!r} is outside the harness: edit only {', '.join(HARNESS_FILES)} or diagnostics/*.py")
    if str(p) not in HARNESS_FILES and not (len(p.parts) == 2 and p.parts[0] == "diagnostics" and p.suffix == ".py"):
        raise EditFailed(f"{path!r} is not a harness file: edit only {', '.join(HARNESS_FILES)} or diagnostics/*.py")
    return str(p)


def apply_edits(files: dict[str, str], edits: list[Edit]) -> dict[str, str]:
    """The changed files (path -> new text) after applying `edits` in order to `files`."""
    current = dict(files)
    changed: dict[str, str] = {}
    for e in edits:
        path = check_path(e.path)
        if e.search is None:
            text = e.replace
        else:
            if path not in current:
                raise EditFailed(f"{path} does not exist: to create it, give the whole file with no search block")
            count = current[path].count(e.search)
            if count != 1:
                where = "not found" if count == 0 else f"found {count} times"
                raise EditFailed(f"search block {where} in {path}: copy the exact text of one unique passage")
            text = current[path].replace(e.search, e.replace, 1)
        current[path] = changed[path] = text
    changed = {p: t for p, t in changed.items() if files.get(p) != t}
    if not changed:
        raise EditFailed("the edits change nothing: the intervention must change at least one harness file")
    return changed


def catalog_edits(inp: CodeInput, author: str) -> CodeResult:
    """The intervention's catalog transform as whole files, exactly as `catalog.apply` writes them. Deterministic: a
    transform that does not apply fails every repair round the same way (the candidate is rejected with the reason)."""
    tid = inp.intervention.transform
    change = apply(tid, inp.files, inp.findings) if tid in CATALOG else None
    if change is None:
        raise ValueError(f"transform {tid!r} does not apply to this harness")
    return CodeResult(edits=[Edit(path=p, replace=text) for p, text in sorted(change.files.items())],
                      message=f"{inp.intervention.change} [{author}]")
