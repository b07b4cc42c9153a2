"""Where a run's harness starts: the domain's template, or a directory the user passes (`--harness DIR`).

A starting harness is plain files: a directory laid out as `templates/<domain>/` (harness.yaml, rewards.py, ...).
Its top-level README.md is documentation, not harness: it stays outside the run (the flawed harnesses of the repair
benchmark say there what is wrong with them, and the agents must find that from evidence). The digest names the
content, whatever directory it was read from, so a comparison's report and every run started from it agree on what
they started from.

Only the files and `harness.yaml` are checked here; its code is checked by `jobs.validate_harness`, in an isolated
child, before anything is created from it.
"""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path

from evotrainer.base.errors import UserError
from evotrainer.workspaces import TEMPLATES

DOCUMENTATION = frozenset({"README.md"})  # top-level files that describe a harness and are not part of it
MAX_FILE_BYTES = 1 << 20  # a harness is code and a recipe: a larger file is a mistake (data, a checkpoint)


@dataclass(frozen=True)
class StartingHarness:
    path: Path
    domain: str
    files: tuple[str, ...]  # relative paths, sorted
    digest: str  # sha256 over (path, content) of `files`, 12 hex digits
    template: bool  # the domain's own template

    @property
    def label(self) -> str:
        """How reports name it: `templates/<domain>` or the directory."""
        return f"templates/{self.domain}" if self.template else str(self.path)

    def copy_to(self, dest: Path) -> None:
        """Its files (and only those: no README) into `dest`, created as needed."""
        for rel in self.files:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.path / rel, dest / rel)


def _files(root: Path) -> list[str]:
    """The harness's files (sorted), refusing what a harness cannot hold: links, devices, huge files."""
    out = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if "__pycache__" in rel.parts or p.suffix == ".pyc" or rel.parts[0] == ".git":
            continue
        if p.is_symlink() or not (p.is_file() or p.is_dir()):
            raise UserError(f"harness {root} holds {rel}, which is not a plain file (a link or a device): a harness "
                            "is plain files; copy the target in")
        if p.is_dir() or str(rel) in DOCUMENTATION:
            continue
        if p.stat().st_size > MAX_FILE_BYTES:
            raise UserError(f"harness {root} holds {rel} of {p.stat().st_size >> 20} MiB: a harness is code and a "
                            "recipe; keep data and checkpoints outside it")
        out.append(str(rel))
    return out


def digest(root: Path, files: list[str] | tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for rel in files:
        data = (root / rel).read_bytes()
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()[:12]


def starting_harness(domain: str | None, harness: str | Path | None = None) -> StartingHarness:
    """The harness a run starts from: `harness` when given (its domain read from its harness.yaml, and checked
    against `domain` when that is given too), else the template of `domain`. One UserError for anything wrong."""
    from evotrainer.trainer.domains import get_domain
    from evotrainer.trainer.harness import load_spec

    if harness is None:
        if domain is None:
            raise UserError("pass --domain or --harness DIR: a run needs a domain or a harness that names one")
        root = TEMPLATES / domain
        if not root.is_dir():
            known = sorted(p.name for p in TEMPLATES.iterdir() if p.is_dir())
            raise UserError(f"no harness template for domain {domain!r}: templates exist for {', '.join(known)}")
    else:
        root = Path(harness).expanduser().resolve()
        if not root.exists():
            raise UserError(f"harness directory {harness} does not exist: pass a directory laid out as "
                            "workspaces/templates/<domain>/")
        if not root.is_dir():
            raise UserError(f"--harness {harness} is a file: pass the directory that holds harness.yaml")
    try:
        spec = load_spec(root)
    except UnicodeDecodeError as e:
        raise UserError(f"{root / 'harness.yaml'} is not UTF-8 text (byte {e.start}): save it as UTF-8") from e
    get_domain(spec.domain)  # a domain the package has: one clear line otherwise
    if domain is not None and spec.domain != domain:
        raise UserError(f"harness {root} is for domain {spec.domain!r}, not {domain!r}: drop --domain (the "
                        "harness names its own) or pass a harness of that domain")
    files = _files(root)
    return StartingHarness(path=root, domain=spec.domain, files=tuple(files), digest=digest(root, files),
                           template=harness is None or root == (TEMPLATES / spec.domain).resolve())


def checked_harness(domain: str | None, harness: str | Path | None = None) -> StartingHarness:
    """`starting_harness`, and a user's harness's code checked as `evotrainer validate` does (imports, every reward on
    a real batch, in an isolated child), before anything is created from it. The template is the package's own."""
    from evotrainer.base.settings import work_dir
    from evotrainer.trainer import jobs

    start = starting_harness(domain, harness)
    if not start.template:
        scratch = work_dir()
        scratch.mkdir(parents=True, exist_ok=True)
        problems = jobs.validate_harness(start.path, scratch, label=f"harness {harness}")
        if problems:
            raise UserError(f"harness {harness} is invalid: {problems[0]} (see `evotrainer validate {harness}`)")
    return start
