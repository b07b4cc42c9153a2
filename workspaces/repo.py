"""The harness git repository: the only thing agents edit (DESIGN §3).

Branch `main` is the champion line; tag `gen-0` marks the harness it started from (`source.py`). Each
intervention is a branch `cand/g<N>-<slug>` with its own worktree, committed with trailers
(Intervention-Id, Hypothesis, Factor, Parent-Commit, Generation). A promotion merges the branch
into `main` and tags the merge `gen-<N>`; a rejection tags the branch tip `rejected/g<N>-<slug>`
and removes its worktree, keeping the branch as negative evidence. Verdicts and reasons live in
the annotated tags' messages (JSON), so `git tag -n` and `evotrainer branches` tell the same story.

Harness code runs with a candidate's worktree as its working directory, so everything in a worktree
is untrusted (DESIGN §5): git never runs hooks and never stages a path the edit did not name, and
non-regular files (symlinks, submodules) are refused. Every command goes through `_run`: a plain
subprocess (GitPython copies the whole process environment into each call, and its `index.add`
changes the process's working directory, DESIGN §10) with
- an environment holding only PATH, locale, the author and committer, and a HOME without config:
  no API key or token of the orchestrator reaches git or anything git starts;
- hooks and fsmonitor off, no system, global or extra attributes config, literal pathspecs;
- the git directory named explicitly (`--git-dir`, `--work-tree`), never discovered from the
  worktree's `.git` file, which harness code could replace with a repository of its own.
Commands run under an exclusive file lock so that threads and processes can create and commit
candidates concurrently. Any failure (git, filesystem, archive) is a one-line `UserError`, so a
candidate that cannot be materialised is rejected with its reason and the run goes on.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Literal

from filelock import FileLock
from pydantic import BaseModel

from evotrainer.base.errors import UserError
from evotrainer.workspaces.source import StartingHarness, starting_harness

IDENTITY = {"GIT_AUTHOR_NAME": "EvoTrainer", "GIT_AUTHOR_EMAIL": "evotrainer@localhost",
            "GIT_COMMITTER_NAME": "EvoTrainer", "GIT_COMMITTER_EMAIL": "evotrainer@localhost"}
TRAILERS = ("Intervention-Id", "Hypothesis", "Factor", "Parent-Commit", "Generation")
REGULAR_MODES = ("100644", "100755")  # index modes of plain files; 120000 is a symlink, 160000 a submodule
_MODE_NAMES = {"120000": "a symlink", "160000": "a submodule"}
_EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
# paths each worktree's edit wrote (write_files) since its last reset: what commit stages when not told.
# Keyed by the resolved worktree; set.update and dict.pop are atomic under the GIL.
_edited: dict[str, set[str]] = {}
_empty: str | None = None


class GitFailed(UserError):
    """A git command exited non-zero; the message is its last line of stderr."""


class BranchRecord(BaseModel):
    """One candidate branch as `evotrainer branches` lists it."""

    branch: str
    generation: int
    parent: str  # the champion commit it branched from
    head: str
    factor: str = ""
    hypothesis: str = ""
    intervention_id: str = ""
    status: Literal["open", "promoted", "rejected", "inconclusive"]
    effect: float | None = None
    reason: str = ""
    repairs: list[str] = []  # the gates the champion failed that the candidate repaired (its verdict's)


def slugify(text: str, max_len: int = 40) -> str:
    """An agent-proposed name as a safe branch component: lowercase letters, digits and dashes."""
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:max_len].strip("-")
    return slug or "candidate"


def _empty_dir() -> str:
    """An empty directory of this process: git's hooks path, HOME and init template (no hooks, no config).
    Made anew should anything have been written into it."""
    global _empty
    if _empty is None or not os.path.isdir(_empty) or os.listdir(_empty):
        _empty = tempfile.mkdtemp(prefix="evotrainer-git-")
        atexit.register(shutil.rmtree, _empty, True)
    return _empty


def _git_env() -> dict[str, str]:
    """All git gets from the environment: nothing of the orchestrator's (API keys, tokens, GIT_DIR, ...)."""
    return {"PATH": os.environ.get("PATH", os.defpath), "HOME": _empty_dir(), "LANG": "C", "LC_ALL": "C",
            "LANGUAGE": "C", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0",
            **IDENTITY}


def _run(args: Iterable[str], *, cwd: Path, git_dir: Path | None = None, work_tree: Path | None = None) -> bytes:
    """Run one git command hardened as the module docstring says; its stdout, or `GitFailed`."""
    args = list(args)
    cmd = ["git", "--no-pager", "--literal-pathspecs", "-c", f"core.hooksPath={_empty_dir()}",
           "-c", "core.fsmonitor=false", "-c", f"core.attributesFile={os.devnull}"]
    if git_dir is not None:
        cmd += [f"--git-dir={git_dir}", f"--work-tree={work_tree}"]
    try:
        res = subprocess.run([*cmd, *args], cwd=str(cwd), env=_git_env(), capture_output=True, check=False)
    except OSError as e:
        hint = "; install git (Debian package `git`)" if shutil.which("git", path=_git_env()["PATH"]) is None else ""
        raise UserError(f"cannot run git in {cwd}: {e}{hint}") from e
    if res.returncode:
        err = res.stderr.decode(errors="replace").strip().splitlines() or [f"exit status {res.returncode}"]
        raise GitFailed(f"git {args[0]} failed in {cwd}: {err[-1]}")
    return res.stdout


def harness_commit(harness_dir: str | Path) -> str:
    """The commit of a harness repository (or worktree) at `harness_dir`, '' when the directory is not the root of
    one (the template inside the package's own checkout, a plain directory): what `evotrainer train` records."""
    harness_dir = Path(harness_dir).resolve()
    try:
        lines = _run(["rev-parse", "--show-toplevel", "HEAD"], cwd=harness_dir).decode().split()
    except (UserError, OSError):
        return ""
    if len(lines) != 2 or Path(lines[0]).resolve() != harness_dir:
        return ""
    return lines[1]


@contextmanager
def _user_errors(what: str) -> Iterator[None]:
    """Filesystem and archive failures as one `UserError` sentence (a `UserError` passes as it is)."""
    try:
        yield
    except UserError:
        raise
    except (OSError, tarfile.TarError, UnicodeError) as e:
        raise UserError(f"{what}: {' '.join(str(e).split())}") from e


def _checked_path(root: Path, rel: str) -> str:
    """`rel` as a clean relative path inside `root` of a regular file (or of one still to be written).

    Refused with the reason: an absolute path, `..`, git's own files (`.git/`, `.gitattributes`, `.gitmodules`,
    ...), a path that is a symlink, goes through one, is not a regular file, or resolves outside `root`.
    """
    p = PurePosixPath(rel)
    why = ""
    if not rel or any(ord(c) < 32 for c in rel):
        why = "is empty or holds a control character"
    elif p.is_absolute():
        why = "is an absolute path"
    elif ".." in p.parts:
        why = "climbs out with '..'"
    elif not p.parts:
        why = "names no file"
    elif any(part.lower().startswith(".git") for part in p.parts):
        why = "is git metadata (.git/, .gitattributes, .gitmodules, ...)"
    else:
        cur = root
        for i, part in enumerate(p.parts):
            cur = cur / part
            if cur.is_symlink():
                link = "/".join(p.parts[:i + 1])
                why = "is a symlink" if i == len(p.parts) - 1 else f"goes through the symlink {link!r}"
                break
        else:
            if cur.exists() and not cur.is_file():
                why = "is not a regular file"
            elif not cur.resolve().is_relative_to(root):
                why = "resolves outside the harness repository"
    if why:
        raise UserError(f"refused: {rel!r} {why}; candidates may only change regular files inside the harness "
                        f"repository {root}")
    return str(p)


def _keep(rel: str) -> str:
    """An exclude pattern matching exactly the file `rel` (for `git clean -e`)."""
    return "/" + re.sub(r"([\\*?\[\]!# ])", r"\\\1", rel)


class HarnessRepo:
    def __init__(self, path: str | Path):
        self.path = Path(path).resolve()
        self.git_dir = self.path / ".git"
        try:
            if not self.git_dir.is_dir():
                raise GitFailed("no .git directory")
            self._git("rev-parse", "--git-dir")
        except GitFailed as e:
            raise UserError(f"{self.path} is not a harness repository (no git repository there)") from e
        self._lock_path = self.git_dir / "evotrainer.lock"

    # -- creation ------------------------------------------------------------------------------
    @classmethod
    def init_from_template(cls, path: str | Path, domain: str, source: StartingHarness | None = None) -> HarnessRepo:
        """A new repository holding the starting harness (`source`, default the domain's template), committed on
        `main` and tagged `gen-0` with where it came from and its digest."""
        start = source or starting_harness(domain)
        path = Path(path).resolve()  # git runs with this as its working directory: a relative path would nest
        with _user_errors(f"cannot create the harness repository {path}"):
            path.mkdir(parents=True, exist_ok=True)
            start.copy_to(path)
            _run(["init", "-q", "-b", "main", f"--template={_empty_dir()}", str(path)], cwd=path)
            (path / ".gitignore").write_text("__pycache__/\n*.pyc\n")
            repo = cls(path)
            repo._stage(repo.path, [".gitignore", *start.files], base=_EMPTY_TREE)
            what = f"the {start.domain} domain" if start.template else f"{start.label} ({start.domain})"
            repo._git("commit", "-q", "--no-verify", "-m", f"Starting harness of {what}")
            repo._git("tag", "-a", "gen-0", "-m", json.dumps({"generation": 0, "source": start.label,
                                                              "digest": start.digest}))
        return repo

    @contextmanager
    def _locked(self) -> Iterator[None]:
        # A fresh FileLock per call holds its own descriptor, so it excludes other threads of this process as well
        # as other processes. filelock opens with O_NOFOLLOW: a symlink planted at the lock's path is refused, never
        # followed to create or open a file elsewhere.
        with FileLock(self._lock_path, mode=0o600):
            yield

    def _admin_dir(self, worktree: Path) -> Path:
        """The git directory of one of our worktrees, found from the repository's side (`.git/worktrees/*/gitdir`
        names the worktree), never from the worktree's own `.git` file."""
        if worktree == self.path:
            return self.git_dir
        for gitdir in sorted((self.git_dir / "worktrees").glob("*/gitdir")):
            if Path(gitdir.read_text().strip()).parent.resolve() == worktree:
                return gitdir.parent
        raise UserError(f"{worktree} is not a worktree of the harness repository {self.path}")

    def _git(self, *args: str, worktree: Path | None = None) -> str:
        """A git command on the repository (or on one of its worktrees); its output less the final newline."""
        tree = Path(worktree).resolve() if worktree is not None else self.path
        out = _run(args, cwd=tree, git_dir=self._admin_dir(tree), work_tree=tree).decode(errors="surrogateescape")
        return out[:-1] if out.endswith("\n") else out

    def _stage(self, tree: Path, paths: list[str], base: str = "HEAD") -> None:
        """Stage exactly `paths` and check that the index now differs from `base` in those paths only and holds
        regular files only."""
        self._git("add", "--", *paths, worktree=tree)
        staged = set(self._git("diff", "--cached", "--name-only", "-z", "--no-renames", base, worktree=tree)
                     .split("\0")) - {""}
        if extra := sorted(staged - set(paths)):
            raise UserError(f"refused: the staged tree holds {', '.join(map(repr, extra))}, which the edit did not "
                            "name; only the edited files may be committed")
        for entry in self._git("ls-files", "-s", "-z", worktree=tree).split("\0"):
            mode, _, rest = entry.partition(" ")
            if entry and mode not in REGULAR_MODES:
                path = rest.split("\t", 1)[-1]
                raise UserError(f"refused: {path!r} would be committed as {_MODE_NAMES.get(mode, f'mode {mode}')}; "
                                "only regular files may be committed")

    def _scrub(self, tree: Path) -> None:
        """The worktree as its commit has it: changes and files nobody committed (harness output too) go."""
        self._git("checkout", "-q", "--", ".", worktree=tree)
        self._git("clean", "-ffdxq", worktree=tree)

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
        with _user_errors(f"cannot export {ref!r} from {self.path}"):
            tmp = dest.with_name(dest.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            try:
                data = _run(["archive", "--format=tar", ref], cwd=self.path, git_dir=self.git_dir, work_tree=self.path)
            except GitFailed as e:
                raise UserError(f"cannot export {ref!r} from {self.path}: {e}") from e
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                tar.extractall(tmp, filter="data")
            os.replace(tmp, dest)
        return dest

    # -- candidates ----------------------------------------------------------------------------
    def create_candidate(self, generation: int, name: str, worktrees_dir: str | Path) -> tuple[str, Path]:
        """A new branch `cand/g<N>-<slug>` off the champion, checked out in its own worktree."""
        with _user_errors(f"cannot create a candidate worktree in {worktrees_dir}"), self._locked():
            base = f"cand/g{generation}-{slugify(name)}"
            existing = set(self._git("branch", "--list", "--format=%(refname:short)", "cand/*").split())
            branch, n = base, 2
            while branch in existing:
                branch, n = f"{base}-{n}", n + 1
            worktree = Path(worktrees_dir).resolve() / branch.replace("/", "--")
            worktree.parent.mkdir(parents=True, exist_ok=True)
            self._git("worktree", "add", "-q", "-b", branch, str(worktree), "main")
            _edited.pop(str(worktree), None)  # a fresh worktree has no edit (its path may have served a discarded one)
        return branch, worktree

    @staticmethod
    def write_files(worktree: str | Path, files: dict[str, str]) -> list[str]:
        """Write agent-produced files into a candidate's worktree; their clean relative paths.

        The harness repository is the only thing agents edit (DESIGN §5): absolute paths, `..`, anything
        under `.git`, symlinks and non-regular files are refused (`_checked_path`) before a byte is written.
        The paths are remembered as the worktree's edit: what `commit` stages.
        """
        root = Path(worktree).resolve()
        rels = [_checked_path(root, rel) for rel in files]
        with _user_errors(f"cannot write the candidate's files into {root}"):
            for rel, content in zip(rels, files.values()):
                target = root / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
                with open(fd, "w", encoding="utf-8") as f:
                    f.write(content)
        _edited.setdefault(str(root), set()).update(rels)
        return rels

    def commit(self, worktree: str | Path, message: str, *, intervention_id: str, hypothesis: str, factor: str,
               generation: int, paths: Iterable[str] | None = None) -> str:
        """Commit a candidate's edit with the intervention's trailers; the new commit.

        The edit is `paths` when given, else the files `write_files` wrote into this worktree since its last
        reset, else the tracked files changed in place. Only those are staged: files that harness code created
        or changed while the candidate was validated are never committed (new ones are removed before staging,
        and the worktree is reset to the commit afterwards). A path that is a symlink, goes through one, or is
        not a regular file inside the worktree is refused with a `UserError` naming it.
        """
        tree = Path(worktree).resolve()
        with _user_errors(f"cannot commit the candidate in {tree}"), self._locked():
            self._git("reset", "-q", worktree=tree)  # the index as HEAD has it: nothing staged by anyone else
            if paths is None:
                changed = self._git("diff", "--name-only", "-z", "--no-renames", worktree=tree).split("\0")
                paths = _edited.get(str(tree)) or [p for p in changed if p]
            named = sorted({_checked_path(tree, p) for p in paths})
            # what harness code left goes before staging (an untracked .gitattributes would change what `add` records)
            self._git("clean", "-ffdxq", *(a for p in named for a in ("-e", _keep(p))), worktree=tree)
            if named:
                self._stage(tree, named)
            if not named or not self._git("diff", "--cached", "--name-only", "HEAD", worktree=tree):
                raise UserError(f"candidate in {tree} has no changes to commit")
            parent = self._git("merge-base", "HEAD", "main", worktree=tree)
            trailers = {"Intervention-Id": intervention_id, "Hypothesis": " ".join(hypothesis.split()),
                        "Factor": factor, "Parent-Commit": parent, "Generation": str(generation)}
            body = "\n".join(f"{k}: {v}" for k, v in trailers.items())
            self._git("commit", "-q", "--no-verify", "-m", message, "-m", body, worktree=tree)
            head = self._git("rev-parse", "HEAD", worktree=tree)
            self._scrub(tree)
            _edited.pop(str(tree), None)
            return head

    def changed_files(self, branch: str) -> list[str]:
        """Paths a candidate changed relative to the champion commit it branched from."""
        self._require_branch(branch)
        return [p for p in self._git("diff", "--name-only", "-z", f"main...{branch}").split("\0") if p]

    def diff(self, branch: str) -> str:
        self._require_branch(branch)
        return self._git("diff", "--no-ext-diff", "--no-textconv", f"main...{branch}")

    def diff_commits(self, base: str, head: str) -> str:
        """The diff from one commit to another (a candidate against the champion commit it branched from, which
        stays right after the branch is merged, unlike `diff`'s merge base)."""
        return self._git("diff", "--no-ext-diff", "--no-textconv", base, head)

    def _require_branch(self, branch: str) -> None:
        try:
            self._git("rev-parse", "--verify", "--quiet", f"refs/heads/{branch}")
        except GitFailed as e:
            raise UserError(f"branch {branch!r} does not exist in {self.path}: see `evotrainer branches`") from e

    def reset_worktree(self, worktree: str | Path) -> None:
        """Undo uncommitted edits in a candidate's worktree (before a Coder's repair round), ignored files too."""
        tree = Path(worktree).resolve()
        with _user_errors(f"cannot reset the candidate worktree {tree}"):
            self._git("reset", "-q", worktree=tree)
            self._scrub(tree)
        _edited.pop(str(tree), None)

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
        with _user_errors(f"cannot commit onto main in {self.path}"), self._locked():
            named = self.write_files(self.path, files)
            _edited.pop(str(self.path), None)
            self._git("reset", "-q")
            self._stage(self.path, named)
            if not self._git("diff", "--cached", "--name-only", "HEAD"):
                return self.head()
            self._git("commit", "-q", "--no-verify", "-m", message)
            return self.head()

    # -- verdicts ------------------------------------------------------------------------------
    def promote(self, branch: str, generation: int, verdict: dict) -> str:
        """Merge a candidate into `main`, tag the merge `gen-<N>` with the verdict, drop its worktree."""
        self._require_branch(branch)
        with self._locked():
            self._git("merge", "-q", "--no-ff", "--no-verify", "-m", f"Promote {branch} (generation {generation})",
                      branch)
            self._git("tag", "-a", f"gen-{generation}", "-m",
                      json.dumps({"generation": generation, "branch": branch, **verdict}))
            self._remove_worktree(branch)
            return self.head()

    def reject(self, branch: str, generation: int, reason: str, verdict: dict | None = None, *,
               inconclusive: bool = False) -> None:
        """Tag the branch tip `rejected/<name>` (or `inconclusive/<name>`: neither a gain nor a loss was shown)
        with the reason; keep the branch, drop its worktree."""
        self._require_branch(branch)
        with self._locked():
            tag = ("inconclusive/" if inconclusive else "rejected/") + branch.removeprefix("cand/")
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
                self._drop_worktree(d)
                removed.append(branch)
            self._git("worktree", "prune")
        return removed

    def _remove_worktree(self, branch: str) -> None:
        for block in self._git("worktree", "list", "--porcelain").split("\n\n"):
            lines = dict(line.split(" ", 1) for line in block.splitlines() if " " in line)
            if lines.get("branch") == f"refs/heads/{branch}":
                self._drop_worktree(Path(lines["worktree"]))
        self._git("worktree", "prune")

    def _drop_worktree(self, path: Path) -> None:
        _edited.pop(str(path.resolve()), None)
        try:
            self._git("worktree", "remove", "--force", str(path))
        except GitFailed:  # not a registered worktree any more, or its `.git` file was tampered with
            shutil.rmtree(path, ignore_errors=True)  # never follows symlinks
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
        inconclusive = {v.get("branch"): v for k, v in tags.items() if k.startswith("inconclusive/")}
        records = []
        refs = self._git("for-each-ref", "refs/heads/cand", "--format=%(refname:short) %(objectname)")
        for line in refs.splitlines():
            name, head = line.split()
            trailers = self._trailers(head)
            status, info = ("promoted", promoted[name]) if name in promoted else \
                ("rejected", rejected[name]) if name in rejected else \
                ("inconclusive", inconclusive[name]) if name in inconclusive else ("open", {})
            m = re.match(r"cand/g(\d+)-", name)
            records.append(BranchRecord(
                branch=name, generation=int(trailers.get("Generation") or (m.group(1) if m else 0)),
                parent=trailers.get("Parent-Commit", head), head=head, factor=trailers.get("Factor", ""),
                hypothesis=trailers.get("Hypothesis", ""), intervention_id=trailers.get("Intervention-Id", ""),
                status=status, effect=info.get("effect"),
                reason=info.get("reason") or "; ".join(info.get("reasons", [])), repairs=info.get("repairs") or [],
            ))
        return sorted(records, key=lambda r: (r.generation, r.branch))
