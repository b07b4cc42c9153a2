"""The harness repository on a real git repository: candidates, concurrency, promotion, rejection."""

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from evotrainer.base.errors import UserError
from evotrainer.workspaces.repo import HarnessRepo, slugify


def _git(path, *args) -> str:
    return subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, check=True).stdout


def _edit_and_commit(repo_path: str, worktrees: str, generation: int, name: str, weight: str) -> str:
    repo = HarnessRepo(repo_path)
    branch, wt = repo.create_candidate(generation, name, worktrees)
    y = wt / "harness.yaml"
    y.write_text(y.read_text().replace("weight: 0.1 ", f"weight: {weight} "))
    repo.commit(wt, f"Set the format weight to {weight}", intervention_id=f"i-{name}",
                hypothesis=f"if the format weight is {weight}, format failures drop because ...",
                factor="reward.answer_format.weight", generation=generation)
    return branch


def test_init_tags_gen0_and_needs_no_global_identity(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.gitconfig: explicit author and committer only
    repo = HarnessRepo.init_from_template(tmp_path / "h", "math")
    assert _git(repo.path, "tag").split() == ["gen-0"]
    assert _git(repo.path, "log", "-1", "--format=%an <%ae> / %cn").strip() == \
        "EvoTrainer <evotrainer@localhost> / EvoTrainer"
    assert (repo.path / "harness.yaml").is_file() and (repo.path / "rewards.py").is_file()


def test_init_from_a_relative_path(tmp_path, monkeypatch):
    """`evotrainer run runs/demo` hands a relative path: the repository is made there, not nested inside it."""
    monkeypatch.chdir(tmp_path)
    repo = HarnessRepo.init_from_template(Path("runs") / "demo" / "harness", "math")
    assert repo.path == tmp_path / "runs" / "demo" / "harness" and (repo.path / ".git").is_dir()
    assert not (repo.path / "runs").exists() and _git(repo.path, "tag").split() == ["gen-0"]


def test_concurrent_candidates_promote_reject_and_lineage_agree(tmp_path):
    repo = HarnessRepo.init_from_template(tmp_path / "h", "math")
    wts = str(tmp_path / "worktrees")
    branches: list[str] = []
    threads = [threading.Thread(target=lambda n=n, w=w: branches.append(_edit_and_commit(str(repo.path), wts, 1, n, w)))
               for n, w in (("format up", "0.3"), ("format down", "0.05"))]
    # and one from another process at the same time
    code = ("import sys; from tests.test_repo import _edit_and_commit; "
            "print(_edit_and_commit(sys.argv[1], sys.argv[2], 1, 'format zero', '0.0'))")
    proc = subprocess.Popen([sys.executable, "-c", code, str(repo.path), wts], stdout=subprocess.PIPE, text=True,
                            cwd=str(Path(__file__).parents[1]))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    branches.append(out.strip().splitlines()[-1])
    assert sorted(branches) == ["cand/g1-format-down", "cand/g1-format-up", "cand/g1-format-zero"]
    _git(repo.path, "fsck", "--strict")  # no corruption

    repo.promote("cand/g1-format-up", 1, {"effect": 0.04, "interval": [0.01, 0.07]})
    repo.reject("cand/g1-format-down", 1, "dev fell: -0.03 [-0.05, -0.01]")
    repo.reject("cand/g1-format-zero", 1, "gate format_failures fired")

    records = {r.branch: r for r in repo.lineage()}
    assert {b: r.status for b, r in records.items()} == {
        "cand/g1-format-up": "promoted", "cand/g1-format-down": "rejected", "cand/g1-format-zero": "rejected"}
    assert records["cand/g1-format-up"].effect == 0.04
    assert records["cand/g1-format-zero"].reason == "gate format_failures fired"
    assert records["cand/g1-format-down"].factor == "reward.answer_format.weight"
    assert records["cand/g1-format-down"].parent == _git(repo.path, "rev-parse", "gen-0^{commit}").strip()
    tags = set(_git(repo.path, "tag").split())
    assert tags == {"gen-0", "gen-1", "rejected/g1-format-down", "rejected/g1-format-zero"}
    all_log = _git(repo.path, "log", "--all", "--format=%s")
    assert all(f"Set the format weight to {w}" in all_log for w in ("0.3", "0.05", "0.0"))
    assert "weight: 0.3 " in (repo.path / "harness.yaml").read_text()  # main carries the promoted change
    assert _git(repo.path, "worktree", "list").count("\n") == 1  # only the main worktree is left
    assert set(_git(repo.path, "branch", "--format=%(refname:short)").split()) >= set(records)  # branches kept


def test_names_are_sanitised_and_unique(tmp_path):
    repo = HarnessRepo.init_from_template(tmp_path / "h", "math")
    assert slugify("../../etc; rm -rf /") == "etc-rm-rf"
    assert slugify("!!!") == "candidate"
    b1, _ = repo.create_candidate(2, "Drop zero-variance groups", tmp_path / "wt")
    b2, _ = repo.create_candidate(2, "drop zero variance groups", tmp_path / "wt")
    assert (b1, b2) == ("cand/g2-drop-zero-variance-groups", "cand/g2-drop-zero-variance-groups-2")


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(UserError, match="not a harness repository"):
        HarnessRepo(tmp_path)
    repo = HarnessRepo.init_from_template(tmp_path / "h", "math")
    with pytest.raises(UserError, match="branch 'cand/g9-nope' does not exist"):
        repo.diff("cand/g9-nope")
    _, wt = repo.create_candidate(1, "empty", tmp_path / "wt")
    with pytest.raises(UserError, match="no changes to commit"):
        repo.commit(wt, "m", intervention_id="i", hypothesis="h", factor="f", generation=1)
    with pytest.raises(UserError, match="no harness template for domain 'chess'"):
        HarnessRepo.init_from_template(tmp_path / "c", "chess")


def test_edits_outside_the_harness_are_refused(tmp_path):
    repo = HarnessRepo.init_from_template(tmp_path / "h", "math")
    _, wt = repo.create_candidate(1, "edit", tmp_path / "wt")
    (tmp_path / "outside.txt").write_text("sealed")
    (wt / "link").symlink_to(tmp_path)
    for bad in ("../outside.txt", str(tmp_path / "outside.txt"), ".git/config", "link/outside.txt",
                "diagnostics/../../outside.txt"):
        with pytest.raises(UserError, match="refused: "):
            HarnessRepo.write_files(wt, {"rewards.py": "# fine\n", bad: "hacked"})
        assert (tmp_path / "outside.txt").read_text() == "sealed"
        assert "# fine" not in (wt / "rewards.py").read_text()  # nothing written when one path is refused
    assert HarnessRepo.write_files(wt, {"diagnostics/gate.py": "X = 1\n"}) == ["diagnostics/gate.py"]
