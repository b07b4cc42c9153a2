"""The harness git repository: the only thing agents edit (DESIGN §3).

Branch `main` is the champion line; tag `gen-0` marks the template it started from. Each
intervention is a branch `cand/g<N>-<slug>` with its own worktree, committed with trailers
(Intervention-Id, Hypothesis, Factor, Parent-Commit, Generation). A promotion merges the branch
into `main` and tags the merge `gen-<N>`; a rejection tags the branch tip `rejected/g<N>-<slug>`
and removes its worktree, keeping the branch as negative evidence. Verdicts and reasons live in
the annotated tags' messages (JSON), so `git tag -n` and `evotrainer branches` tell the same story.

Every command runs through `repo.git.<cmd>` (a subprocess per call, GitPython's `index.add`
changes the process's working directory and is unsafe across threads, DESIGN §10) with an explicit
author and committer, under an exclusive file lock so that threads and processes can create and
commit candidates concurrently.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import git
from pydantic import BaseModel

from evotrainer.errors import UserError
from evotrainer.workspaces import TEMPLATES

IDENTITY = {"GIT_AUTHOR_NAME": "EvoTrainer", "GIT_AUTHOR_EMAIL": "evotrainer@localhost",
            "GIT_COMMITTER_NAME": "EvoTrainer", "GIT_COMMITTER_EMAIL": "evotrainer@localhost"}
TRAILERS = ("Intervention-Id", "Hypothesis", "Factor", "Parent-Commit", "Generation")
_thread_lock = threading.Lock()  # fcntl locks are per process: threads of one process also need this


class BranchRecord(BaseModel):
    """One candidate branch as `evotrainer branches` lists it."""

    branch: str
    generation: int
    parent: str  # the champion commit it branched from
    head: str
    factor: str = ""
    hypothesis: str = ""
    intervention_id: str = ""
    status: Literal["open", "promoted", "rejected"]
    effect: float | None = None
    reason: str = ""


def slugify(text: str, max_len: int = 40) -> str:
    """An agent-proposed name as a safe branch component: lowercase letters, digits and dashes."""
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:max_len].strip("-")
    return slug or "candidate"


class HarnessRepo:
    def __init__(self, path: str | Path):
        self.path = Path(path).resolve()
        try:
            self.repo = git.Repo(self.path)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError) as e:
            raise UserError(f"{self.path} is not a harness repository (no git repository there)") from e
        self._lock_path = Path(self.repo.git_dir) / "evotrainer.lock"

    # -- creation ------------------------------------------------------------------------------
    @classmethod
    def init_from_template(cls, path: str | Path, domain: str) -> HarnessRepo:
        """A new repository holding the domain's starting harness, committed on `main` and tagged `gen-0`."""
        template = TEMPLATES / domain
        if not template.is_dir():
            known = sorted(p.name for p in TEMPLATES.iterdir() if p.is_dir())
            raise UserError(f"no harness template for domain {domain!r}: templates exist for {', '.join(known)}")
        path = Path(path)
        shutil.copytree(template, path, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"), dirs_exist_ok=True)
        repo = git.Repo.init(path, initial_branch="main")
        (path / ".gitignore").write_text("__pycache__/\n*.pyc\n")
        with repo.git.custom_environment(**IDENTITY):
            repo.git.add("-A")
            repo.git.commit("-q", "-m", f"Starting harness of the {domain} domain")
            repo.git.tag("-a", "gen-0", "-m", json.dumps({"generation": 0, "source": f"templates/{domain}"}))
        return cls(path)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with _thread_lock, open(self._lock_path, "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _git(self, *args: str, cwd: Path | None = None) -> str:
        g = git.Git(str(cwd or self.path))
        with g.custom_environment(**IDENTITY):
            return g.execute(["git", *args])

    def head(self, ref: str = "main") -> str:
        return self._git("rev-parse", ref)

    def export(self, ref: str, dest: str | Path) -> Path:
        """The files of `ref` as a plain directory (a snapshot, no git metadata); reused when already there.

        Backtests train and replay from snapshots keyed by commit, so a branch's worktree may be edited or
        removed meanwhile without changing what was measured.
        """
        dest = Path(dest)
        if (dest / "harness.yaml").is_file():
            return dest
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        data = subprocess.run(["git", "-C", str(self.path), "archive", "--format=tar", ref], capture_output=True,
                              check=False)
        if data.returncode:
            raise UserError(f"cannot export {ref!r} from {self.path}: {data.stderr.decode().strip()}")
        with tarfile.open(fileobj=io.BytesIO(data.stdout)) as tar:
            tar.extractall(tmp, filter="data")
        os.replace(tmp, dest)
        return dest

    # -- candidates ----------------------------------------------------------------------------
    def create_candidate(self, generation: int, name: str, worktrees_dir: str | Path) -> tuple[str, Path]:
        """A new branch `cand/g<N>-<slug>` off the champion, checked out in its own worktree."""
        with self._locked():
            base = f"cand/g{generation}-{slugify(name)}"
            existing = set(self._git("branch", "--list", "--format=%(refname:short)", "cand/*").split())
            branch, n = base, 2
            while branch in existing:
                branch, n = f"{base}-{n}", n + 1
            worktree = Path(worktrees_dir).resolve() / branch.replace("/", "--")
            worktree.parent.mkdir(parents=True, exist_ok=True)
            self._git("worktree", "add", "-q", "-b", branch, str(worktree), "main")
        return branch, worktree

    @staticmethod
    def write_files(worktree: str | Path, files: dict[str, str]) -> list[str]:
        """Write agent-produced files into a candidate's worktree, refusing any path that leaves it.

        The harness repository is the only thing agents edit (DESIGN §5): absolute paths, `..`
        escapes, symlinks out of the tree and anything under `.git` are refused before a byte is written.
        """
        root = Path(worktree).resolve()
        targets = []
        for rel in files:
            target = (root / rel).resolve()
            if Path(rel).is_absolute() or not target.is_relative_to(root) or ".git" in Path(rel).parts:
                raise UserError(f"refused: {rel!r} is outside the harness repository {root}; candidates may only "
                                "change files of the harness")
            targets.append(target)
        for target, content in zip(targets, files.values()):
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
        return [str(t.relative_to(root)) for t in targets]

    def commit(self, worktree: str | Path, message: str, *, intervention_id: str, hypothesis: str, factor: str,
               generation: int) -> str:
        """Commit everything changed in a candidate's worktree, with the intervention's trailers."""
        worktree = Path(worktree)
        with self._locked():
            parent = self._git("merge-base", "HEAD", "main", cwd=worktree)
            self._git("add", "-A", cwd=worktree)
            if not self._git("status", "--porcelain", cwd=worktree):
                raise UserError(f"candidate in {worktree} has no changes to commit")
            trailers = {"Intervention-Id": intervention_id, "Hypothesis": " ".join(hypothesis.split()),
                        "Factor": factor, "Parent-Commit": parent, "Generation": str(generation)}
            body = "\n".join(f"{k}: {v}" for k, v in trailers.items())
            self._git("commit", "-q", "-m", message, "-m", body, cwd=worktree)
            return self._git("rev-parse", "HEAD", cwd=worktree)

    def changed_files(self, branch: str) -> list[str]:
        """Paths a candidate changed relative to the champion commit it branched from."""
        self._require_branch(branch)
        return self._git("diff", "--name-only", f"main...{branch}").split()

    def diff(self, branch: str) -> str:
        self._require_branch(branch)
        return self._git("diff", f"main...{branch}")

    def _require_branch(self, branch: str) -> None:
        try:
            self._git("rev-parse", "--verify", "--quiet", f"refs/heads/{branch}")
        except git.GitCommandError as e:
            raise UserError(f"branch {branch!r} does not exist in {self.path}: see `evotrainer branches`") from e

    def reset_worktree(self, worktree: str | Path) -> None:
        """Undo uncommitted edits in a candidate's worktree (before a Coder's repair round)."""
        self._git("checkout", "-q", "--", ".", cwd=Path(worktree))
        self._git("clean", "-fdq", cwd=Path(worktree))

    def has_own_commit(self, branch: str) -> bool:
        """Whether a candidate branch carries a commit of its own (not only the champion's history)."""
        return self._git("rev-list", "--count", f"main..{branch}") != "0"

    def discard(self, branch: str) -> None:
        """Delete a candidate that never got a commit (an interrupted implement step): worktree and branch."""
        with self._locked():
            self._remove_worktree(branch)
            self._git("branch", "-D", branch)

    def commit_champion(self, files: dict[str, str], message: str) -> str:
        """Commit files straight onto `main` (diagnostics revision: a new analyzer, not an intervention)."""
        with self._locked():
            self.write_files(self.path, files)
            self._git("add", "-A")
            if not self._git("status", "--porcelain"):
                return self.head()
            self._git("commit", "-q", "-m", message)
            return self.head()

    # -- verdicts ------------------------------------------------------------------------------
    def promote(self, branch: str, generation: int, verdict: dict) -> str:
        """Merge a candidate into `main`, tag the merge `gen-<N>` with the verdict, drop its worktree."""
        self._require_branch(branch)
        with self._locked():
            self._git("merge", "-q", "--no-ff", "-m", f"Promote {branch} (generation {generation})", branch)
            self._git("tag", "-a", f"gen-{generation}", "-m",
                      json.dumps({"generation": generation, "branch": branch, **verdict}))
            self._remove_worktree(branch)
            return self.head()

    def reject(self, branch: str, generation: int, reason: str, verdict: dict | None = None) -> None:
        """Tag the branch tip `rejected/<name>` with the reason; keep the branch, drop its worktree."""
        self._require_branch(branch)
        with self._locked():
            tag = "rejected/" + branch.removeprefix("cand/")
            self._git("tag", "-a", tag, branch, "-m",
                      json.dumps({"generation": generation, "branch": branch, "reason": reason, **(verdict or {})}))
            self._remove_worktree(branch)

    def prune_worktrees(self, worktrees_dir: str | Path) -> list[str]:
        """Remove the worktrees of branches no longer open (left by a kill between a verdict and its cleanup);
        returns their branch names."""
        open_branches = {r.branch for r in self.lineage() if r.status == "open"}
        removed = []
        root = Path(worktrees_dir)
        with self._locked():
            self._git("worktree", "prune")
            for d in sorted(root.iterdir()) if root.is_dir() else []:
                branch = d.name.replace("--", "/", 1)
                if branch in open_branches:
                    continue
                try:
                    self._git("worktree", "remove", "--force", str(d))
                except git.GitCommandError:  # not a registered worktree any more: only the folder is left
                    shutil.rmtree(d, ignore_errors=True)
                removed.append(branch)
            self._git("worktree", "prune")
        return removed

    def _remove_worktree(self, branch: str) -> None:
        for block in self._git("worktree", "list", "--porcelain").split("\n\n"):
            lines = dict(line.split(" ", 1) for line in block.splitlines() if " " in line)
            if lines.get("branch") == f"refs/heads/{branch}":
                self._git("worktree", "remove", "--force", lines["worktree"])
        self._git("worktree", "prune")

    # -- reading -------------------------------------------------------------------------------
    def _tag_messages(self) -> dict[str, dict]:
        out = {}
        raw = self._git("for-each-ref", "refs/tags", "--format=%(refname:short)%00%(contents)%00%00")
        for entry in raw.split("\x00\x00"):
            if "\x00" not in entry:
                continue
            name, body = entry.strip("\n").split("\x00", 1)
            try:
                out[name] = json.loads(body.strip())
            except json.JSONDecodeError:
                out[name] = {}
        return out

    def _trailers(self, commit: str) -> dict[str, str]:
        """The EvoTrainer trailers of the newest commit on a branch that carries them."""
        out = self._git("log", "-1", "--format=%(trailers:unfold,only)", "--grep=^Intervention-Id: ", commit)
        pairs = (line.split(": ", 1) for line in out.splitlines() if ": " in line)
        return {k: v for k, v in pairs if k in TRAILERS}

    def lineage(self) -> list[BranchRecord]:
        """Every candidate branch with its trailers and status, oldest generation first."""
        tags = self._tag_messages()
        promoted = {v.get("branch"): v for k, v in tags.items() if k.startswith("gen-") and v.get("branch")}
        rejected = {v.get("branch"): v for k, v in tags.items() if k.startswith("rejected/")}
        records = []
        refs = self._git("for-each-ref", "refs/heads/cand", "--format=%(refname:short) %(objectname)")
        for line in refs.splitlines():
            name, head = line.split()
            trailers = self._trailers(head)
            status, info = ("promoted", promoted[name]) if name in promoted else \
                ("rejected", rejected[name]) if name in rejected else ("open", {})
            m = re.match(r"cand/g(\d+)-", name)
            records.append(BranchRecord(
                branch=name, generation=int(trailers.get("Generation") or (m.group(1) if m else 0)),
                parent=trailers.get("Parent-Commit", head), head=head, factor=trailers.get("Factor", ""),
                hypothesis=trailers.get("Hypothesis", ""), intervention_id=trailers.get("Intervention-Id", ""),
                status=status, effect=info.get("effect"), reason=info.get("reason", ""),
            ))
        return sorted(records, key=lambda r: (r.generation, r.branch))
