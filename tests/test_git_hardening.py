"""Git hardened against the harness code that runs in a candidate's worktree (DESIGN §5, issue #22).

Real repositories in tmp_path; each test plays the harness code by hand: it plants files, symlinks, hooks and a
repository of its own in the worktree after the edit was written, as a validation child could.
"""

import os
import re
import subprocess
from pathlib import Path

import pytest

from evotrainer.base.errors import UserError
from evotrainer.workspaces.repo import HarnessRepo

SECRET = "sk-test-secret"
HOOKS = ("pre-commit", "prepare-commit-msg", "commit-msg", "post-commit", "post-checkout", "post-merge",
         "pre-merge-commit", "reference-transaction", "post-index-change", "pre-auto-gc")


def _git(path, *args) -> str:
    """The test's own git: a clean environment, so that the variables a test plants reach only the code under test."""
    env = {"PATH": os.environ["PATH"], "HOME": str(path), "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, check=True, env=env).stdout


@pytest.fixture
def harness(tmp_path):
    """A math harness with one candidate: (repo, branch, worktree)."""
    repo = HarnessRepo.init_from_template(tmp_path / "h", "math")
    branch, wt = repo.create_candidate(1, "edit", tmp_path / "wt")
    return repo, branch, wt


def _edit(repo: HarnessRepo, wt: Path) -> list[str]:
    return repo.write_files(wt, {"rewards.py": (wt / "rewards.py").read_text() + "\n# edited\n"})


def _commit(repo: HarnessRepo, wt: Path, **kw) -> str:
    return repo.commit(wt, "edit", intervention_id="i", hypothesis="h", factor="f", generation=1, **kw)


def _assert_clean_history(repo: HarnessRepo) -> None:
    """Every path ever committed is a harness file, and no commit holds a symlink or a submodule."""
    names = set(_git(repo.path, "log", "--all", "--name-only", "--format=").split())
    allowed = set(_git(repo.path, "ls-tree", "-r", "--name-only", "gen-0").split())  # the template's files
    assert {n for n in names if not (n in allowed or (n.startswith("diagnostics/") and n.endswith(".py")))} == set()
    raw = _git(repo.path, "log", "--all", "--raw", "--format=")
    assert " 120000 " not in raw and " 160000 " not in raw and ":120000" not in raw and ":160000" not in raw
    assert " 120000 " not in _git(repo.path, "ls-tree", "-r", "main")


def _hook_script(marker: Path) -> str:
    return f'#!/bin/sh\necho "$0" >> {marker}\nenv >> {marker}\n'


def _plant_hooks(hooks_dir: Path, marker: Path) -> None:
    hooks_dir.mkdir(parents=True, exist_ok=True)
    for name in HOOKS:
        (hooks_dir / name).write_text(_hook_script(marker))
        (hooks_dir / name).chmod(0o755)


def test_only_the_named_paths_are_committed(harness, tmp_path):
    repo, branch, wt = harness
    edited = (wt / "rewards.py").read_text() + "\n# edited\r\n"  # CRLF: a planted `text` attribute would rewrite it
    assert repo.write_files(wt, {"rewards.py": edited}) == ["rewards.py"]
    sealed = tmp_path / "sealed.json"
    sealed.write_text('{"answer": 42}')
    # what harness code may leave in its working directory while the candidate is validated
    (wt / "extra.py").write_text("x = 1\n")
    (wt / "diagnostics" / "planted.py").write_text("y = 2\n")
    (wt / "leak_link").symlink_to(sealed)
    (wt / "diagnostics" / "leak.py").symlink_to(sealed)
    (wt / ".gitattributes").write_text("* text\n")
    (wt / "filters.py").write_text((wt / "filters.py").read_text() + "\n# changed by the harness, not the edit\n")
    (wt / "__pycache__").mkdir(exist_ok=True)
    (wt / "__pycache__" / "rewards.cpython-311.pyc").write_bytes(b"planted")

    head = _commit(repo, wt)

    assert _git(repo.path, "show", "--name-only", "--format=", head).split() == ["rewards.py"]
    committed = subprocess.run(["git", "-C", str(repo.path), "show", f"{head}:rewards.py"], capture_output=True,
                               check=True).stdout
    assert committed == edited.encode()  # the bytes the edit wrote
    # the worktree is the commit again: nothing planted survives
    assert not any((wt / p).exists() or (wt / p).is_symlink() for p in (
        "extra.py", "diagnostics/planted.py", "leak_link", "diagnostics/leak.py", ".gitattributes", "__pycache__"))
    assert "changed by the harness" not in (wt / "filters.py").read_text()
    assert sealed.read_text() == '{"answer": 42}'
    repo.promote(branch, 1, {"effect": 0.0})
    _assert_clean_history(repo)


def test_edits_only_in_place_commit_the_changed_tracked_files_only(harness):
    repo, _, wt = harness  # no write_files: the edit is what changed in tracked files
    (wt / "harness.yaml").write_text((wt / "harness.yaml").read_text() + "\n# edited in place\n")
    (wt / "new.py").write_text("x = 1\n")
    (wt / "leak_link").symlink_to("/etc/passwd")
    head = _commit(repo, wt)
    assert _git(repo.path, "show", "--name-only", "--format=", head).split() == ["harness.yaml"]
    _assert_clean_history(repo)


def test_a_symlink_as_an_edit_path_is_refused(harness, tmp_path):
    repo, branch, wt = harness
    sealed = tmp_path / "sealed.json"
    sealed.write_text('{"answer": 42}')
    _edit(repo, wt)
    (wt / "rewards.py").unlink()  # harness code swaps the edited file for a link to the sealed data
    (wt / "rewards.py").symlink_to(sealed)
    with pytest.raises(UserError, match=r"refused: 'rewards.py' is a symlink"):
        _commit(repo, wt)
    (wt / "leak_link").symlink_to(sealed)
    with pytest.raises(UserError, match=r"refused: 'leak_link' is a symlink"):
        _commit(repo, wt, paths=["leak_link"])
    (wt / "diag_link").symlink_to(wt / "diagnostics")  # a link inside the tree is refused too
    with pytest.raises(UserError, match=r"refused: 'diag_link/x.py' goes through the symlink 'diag_link'"):
        repo.write_files(wt, {"diag_link/x.py": "X = 1\n"})
    with pytest.raises(UserError, match=r"refused: 'leak_link' is a symlink"):
        repo.write_files(wt, {"leak_link": "overwrite the sealed data\n"})
    assert sealed.read_text() == '{"answer": 42}'
    assert not repo.has_own_commit(branch)
    # the worktree can still be reset and committed, without the links
    repo.reset_worktree(wt)
    _edit(repo, wt)
    head = _commit(repo, wt)
    assert _git(repo.path, "show", "--name-only", "--format=", head).split() == ["rewards.py"]
    _assert_clean_history(repo)


def test_a_symlink_in_the_history_refuses_every_commit(tmp_path):
    """The staged tree is checked as a whole: a mode-120000 entry (here planted on main by raw git) is refused."""
    repo = HarnessRepo.init_from_template(tmp_path / "h", "math")
    (repo.path / "leak_link").symlink_to("/etc/passwd")
    _git(repo.path, "add", "leak_link")
    _git(repo.path, "-c", "user.name=x", "-c", "user.email=x@x", "commit", "-qm", "planted")
    with pytest.raises(UserError, match=r"refused: 'leak_link' would be committed as a symlink"):
        repo.commit_champion({"diagnostics/gate.py": "X = 1\n"}, "new analyzer")
    _, wt = repo.create_candidate(1, "edit", tmp_path / "wt")
    _edit(repo, wt)
    with pytest.raises(UserError, match=r"refused: 'leak_link' would be committed as a symlink"):
        _commit(repo, wt)


def test_paths_outside_the_harness_or_under_git_are_refused(harness, tmp_path):
    repo, branch, wt = harness
    (tmp_path / "outside.txt").write_text("sealed")
    bad = ("../outside.txt", "diagnostics/../../outside.txt", str(tmp_path / "outside.txt"), ".git/hooks/pre-commit",
           "diagnostics/.git/config", ".gitattributes", ".gitmodules", "")
    for rel in bad:
        named = "^refused: " + re.escape(repr(rel))  # one line naming the path and why
        with pytest.raises(UserError, match=named):
            repo.write_files(wt, {"rewards.py": "# fine\n", rel: "#!/bin/sh\ntouch pwned\n"})
        with pytest.raises(UserError, match=named):
            _commit(repo, wt, paths=["rewards.py", rel])
        with pytest.raises(UserError, match=named):
            repo.commit_champion({rel: "#!/bin/sh\ntouch pwned\n"}, "m")
    assert (tmp_path / "outside.txt").read_text() == "sealed"
    assert "# fine" not in (wt / "rewards.py").read_text()
    assert not (repo.path / ".git" / "hooks" / "pre-commit").exists()
    assert not (repo.path / ".gitattributes").exists() and not (wt / ".gitattributes").exists()
    assert not repo.has_own_commit(branch)
    _assert_clean_history(repo)


def test_hooks_never_run_and_secrets_never_reach_git(tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    repo = HarnessRepo.init_from_template(tmp_path / "h", "math")
    _plant_hooks(repo.path / ".git" / "hooks", marker)
    monitor = tmp_path / "fsmonitor.sh"  # a planted fsmonitor command runs on every status, add and commit
    monitor.write_text(_hook_script(marker))
    monitor.chmod(0o755)
    _git(repo.path, "config", "core.fsmonitor", str(monitor))
    # secrets of the orchestrator, and trace2 told to write them out wherever git sees them
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("GIT_TRACE2_EVENT", str(tmp_path / "trace.json"))
    monkeypatch.setenv("GIT_TRACE2_ENV_VARS", "OPENAI_API_KEY")

    branch, wt = repo.create_candidate(1, "edit", tmp_path / "wt")
    _plant_hooks(repo.path / ".git" / "worktrees" / wt.name / "hooks", marker)
    _edit(repo, wt)
    _commit(repo, wt)
    repo.promote(branch, 1, {"effect": 0.01})
    other, wt2 = repo.create_candidate(2, "other", tmp_path / "wt")
    _plant_hooks(repo.path / ".git" / "worktrees" / wt2.name / "hooks", marker)
    _edit(repo, wt2)
    _commit(repo, wt2)
    repo.reject(other, 2, "dev fell")
    repo.commit_champion({"diagnostics/gate.py": "X = 1\n"}, "new analyzer")
    repo.export("main", tmp_path / "snapshot")
    repo.lineage()
    repo.diff(other)

    assert not marker.exists(), marker.read_text()[:500]
    assert not (tmp_path / "trace.json").exists()  # nothing of the orchestrator's environment reached git
    monkeypatch.delenv("GIT_TRACE2_EVENT")
    objects = subprocess.run(["git", "-C", str(repo.path), "cat-file", "--batch-all-objects", "--batch"],
                             capture_output=True, check=True).stdout
    assert SECRET.encode() not in objects
    _assert_clean_history(repo)


def test_a_repository_planted_in_the_worktree_is_ignored(harness, tmp_path):
    """Harness code replaces the worktree's `.git` file with a repository of its own: git must not use it."""
    repo, branch, wt = harness
    marker = tmp_path / "marker"
    _edit(repo, wt)
    fake = tmp_path / "fake"
    _git(tmp_path, "init", "-q", str(fake))
    _plant_hooks(fake / ".git" / "hooks", marker)
    (wt / ".git").unlink()
    (fake / ".git").rename(wt / ".git")

    head = _commit(repo, wt)

    assert not marker.exists()
    assert _git(repo.path, "rev-parse", branch).strip() == head  # the commit is on the candidate's real branch
    assert _git(repo.path, "show", "--name-only", "--format=", head).split() == ["rewards.py"]
    repo.reject(branch, 1, "tampered")  # and its worktree can still be removed
    assert not wt.exists()
    assert _git(repo.path, "worktree", "list", "--porcelain").count("worktree ") == 1
    _assert_clean_history(repo)


def test_failures_while_materialising_a_candidate_are_user_errors(harness, tmp_path):
    repo, _, wt = harness
    (tmp_path / "a_file").write_text("")
    with pytest.raises(UserError, match="cannot create a candidate worktree"):
        repo.create_candidate(1, "x", tmp_path / "a_file")
    with pytest.raises(UserError, match="cannot write the candidate's files"):
        repo.write_files(wt, {"rewards.py/inner.py": "X = 1\n"})
    with pytest.raises(UserError, match="cannot export 'no-such-ref'"):
        repo.export("no-such-ref", tmp_path / "snap")
    with pytest.raises(UserError, match="cannot export 'main'"):
        repo.export("main", tmp_path / "a_file" / "snap")
    with pytest.raises(UserError, match="is not a worktree of the harness repository"):
        _commit(repo, tmp_path)
    with pytest.raises(UserError, match="git add failed"):
        _commit(repo, wt, paths=["does_not_exist.py"])
    _edit(repo, wt)
    (repo.path / ".git" / "evotrainer.lock").unlink(missing_ok=True)
    (repo.path / ".git" / "evotrainer.lock").symlink_to(tmp_path / "lock-target")
    with pytest.raises(UserError, match="cannot commit the candidate"):
        _commit(repo, wt)  # a planted lock symlink is not followed
    assert not (tmp_path / "lock-target").exists()
