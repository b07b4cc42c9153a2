"""Starting harnesses (`--harness DIR`): what is read from the directory, what is refused, and that `init`, `run`
and `compare` either start from it or stop with one line before anything is written."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from evotrainer.base.errors import UserError
from evotrainer.workspaces import TEMPLATES
from evotrainer.workspaces.run import RunWorkspace
from evotrainer.workspaces.source import starting_harness

from .conftest import run_cli


def _harness(tmp_path, name="h", domain="math"):
    h = tmp_path / name
    shutil.copytree(TEMPLATES / domain, h, ignore=shutil.ignore_patterns("__pycache__"))
    (h / "README.md").write_text("Defect: the learning rate is 10x too low.\n")
    return h


def _git(path, *args) -> str:
    return subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, check=True).stdout


def test_a_harness_directory_is_its_files_without_its_readme_and_its_digest_names_the_content(tmp_path):
    h = _harness(tmp_path)
    start = starting_harness(None, h)
    assert (start.domain, start.template, start.path) == ("math", False, h.resolve())
    assert "README.md" not in start.files and "harness.yaml" in start.files and "diagnostics/README.md" in start.files
    template = starting_harness("math")
    assert template.template and template.label == "templates/math"
    # the same files elsewhere: the same digest; one byte changed: another
    assert starting_harness("math", shutil.copytree(h, tmp_path / "copy")).digest == start.digest == template.digest
    (h / "README.md").write_text("something else entirely")  # documentation is not content
    assert starting_harness(None, h).digest == start.digest
    (h / "rewards.py").write_text((h / "rewards.py").read_text() + "\n# tuned\n")
    assert starting_harness(None, h).digest != start.digest


@pytest.mark.parametrize("case,message", [
    ("missing", "does not exist"),
    ("file", "is a file: pass the directory that holds harness.yaml"),
    ("domain", "is for domain 'math', not 'code'"),
    ("link", "holds rewards.py, which is not a plain file"),
    ("encoding", "is not UTF-8 text"),
    ("no_yaml", "has no harness.yaml"),
    ("unknown_domain", "unknown domain"),
])
def test_a_bad_harness_directory_is_one_clear_error(tmp_path, case, message):
    h = _harness(tmp_path)
    domain = None
    if case == "missing":
        h = tmp_path / "nowhere"
    elif case == "file":
        h = h / "harness.yaml"
    elif case == "domain":
        domain = "code"
    elif case == "link":
        (h / "rewards.py").unlink()
        (h / "rewards.py").symlink_to(TEMPLATES / "math" / "rewards.py")
    elif case == "encoding":
        (h / "harness.yaml").write_bytes(b"domain: math\n# caf\xe9\n")
    elif case == "no_yaml":
        (h / "harness.yaml").unlink()
    elif case == "unknown_domain":
        text = (h / "harness.yaml").read_text()
        (h / "harness.yaml").write_text(text.replace("domain: math", "domain: chess"))
    with pytest.raises(UserError, match=message):
        starting_harness(domain, h)


def test_a_run_started_from_a_harness_says_so_in_git_and_in_run_yaml(tmp_path):
    h = _harness(tmp_path)
    start = starting_harness(None, h)
    ws = RunWorkspace.create(tmp_path / "run", "math", harness=start)
    repo = ws.path / "harness"
    assert sorted(_git(repo, "ls-tree", "-r", "--name-only", "gen-0").split()) == sorted([".gitignore", *start.files])
    tag = json.loads(_git(repo, "tag", "-l", "--format=%(contents)", "gen-0").strip())
    assert tag == {"generation": 0, "source": str(h.resolve()), "digest": start.digest}
    assert ws.config().harness == str(h.resolve())
    assert (repo / "rewards.py").read_bytes() == (h / "rewards.py").read_bytes()
    plain = RunWorkspace.create(tmp_path / "plain", "math")  # the template: recorded as such
    assert plain.config().harness is None
    assert json.loads(_git(plain.path / "harness", "tag", "-l", "--format=%(contents)", "gen-0"))["source"] == \
        "templates/math"


def _tree(root) -> dict:
    return {p: p.stat().st_mtime_ns for p in root.rglob("*")} if root.exists() else {}


def test_init_from_a_harness_and_the_errors_that_create_nothing(tmp_path):
    h = _harness(tmp_path)
    res = run_cli("init", str(tmp_path / "run"), "--harness", str(h))
    assert res.returncode == 0, res.stderr
    assert "harness " + str(h.resolve()) in " ".join(res.stdout.split())
    assert RunWorkspace.open(tmp_path / "run").config().domain == "math"
    # the harness names another domain than --domain; code that does not import: one line, exit 2, nothing made
    bad = _harness(tmp_path, "bad")
    (bad / "rewards.py").write_text((bad / "rewards.py").read_text() + "\n1 / 0\n")
    before = _tree(tmp_path)
    for args, message in ((["--harness", str(h), "--domain", "code"], "is for domain 'math', not 'code'"),
                          (["--harness", str(bad)], "harness code failed to import: ZeroDivisionError")):
        res = run_cli("init", str(tmp_path / "new"), *args)
        assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr, res.stderr
        res = run_cli("run", str(tmp_path / "new"), *args)
        assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert not (tmp_path / "new").exists()
    assert {p: t for p, t in _tree(tmp_path).items() if p.name != "__pycache__" and "__pycache__" not in p.parts} \
        == {p: t for p, t in before.items() if "__pycache__" not in p.parts}


def test_compare_from_a_harness_records_its_digest_and_refuses_another_in_the_same_directory(tmp_path):
    from evotrainer.compare.execution import check_request

    h = _harness(tmp_path)
    out = tmp_path / "cmp"
    bad = _harness(tmp_path, "bad")
    (bad / "rewards.py").write_text("def correctness(:\n")
    res = run_cli("compare", "--harness", str(bad), "--out", str(out), "--seeds", "1")
    assert res.returncode == 2 and "is invalid" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert not out.exists()
    start = starting_harness(None, h)
    request = {"domain": "math", "seeds": 1, "arms": ["reference"], "budget": "smoke", "checkpoint": None,
               "harness": start.digest, "harness_path": str(start.path)}
    out.mkdir()
    check_request(out, request)
    moved = shutil.copytree(h, tmp_path / "moved")  # the same harness read from elsewhere: the same comparison
    check_request(out, {**request, "seeds": 3, "harness_path": str(moved)})
    (moved / "harness.yaml").write_text((moved / "harness.yaml").read_text().replace("1.0e-4", "1.0e-5"))
    with pytest.raises(UserError, match="holds a comparison with other settings"):
        check_request(out, {**request, "harness": starting_harness(None, moved).digest})
    assert sorted(p.name for p in out.iterdir()) == ["request.json"]
