"""Run workspaces, harness validation in the sandbox, and the init/branches/show/validate commands."""

import shutil
import subprocess
import sys

import pytest

from evotrainer.base.errors import UserError
from evotrainer.workspaces import TEMPLATES
from evotrainer.workspaces.run import LAYOUT, RunWorkspace

from .conftest import last_json, run_cli


def test_create_open_and_lock(tmp_path):
    ws = RunWorkspace.create(tmp_path / "run", "math", seed=3)
    assert all((ws.path / d).is_dir() for d in LAYOUT)
    cfg = RunWorkspace.open(ws.path).config()
    assert (cfg.domain, cfg.seed, cfg.meta_llm, cfg.name) == ("math", 3, "offline", "run")
    with ws.lock():
        code = ("import sys; from evotrainer.workspaces.run import RunWorkspace\n"
                "with RunWorkspace(sys.argv[1]).lock(): pass")
        proc = subprocess.run([sys.executable, "-c", code, str(ws.path)], capture_output=True, text=True)
        assert proc.returncode != 0
        import os
        assert f"already being driven by process {os.getpid()}" in proc.stderr
    with ws.lock():  # released: can be taken again
        pass


def test_bad_run_directories(tmp_path):
    with pytest.raises(UserError, match="not an EvoTrainer run"):
        RunWorkspace.open(tmp_path)
    (tmp_path / "run.yaml").write_text("domain: [\n")
    with pytest.raises(UserError, match="not a valid run configuration"):
        RunWorkspace.open(tmp_path)
    ws = RunWorkspace.create(tmp_path / "r", "math")
    shutil.rmtree(ws.path / "reports")
    with pytest.raises(UserError, match=r"incomplete \(missing reports/\)"):
        RunWorkspace.open(ws.path)


def _harness(tmp_path, edit=None, name="h"):
    h = tmp_path / name
    shutil.copytree(TEMPLATES / "math", h)
    if edit:
        edit(h)
    return h


@pytest.mark.parametrize("case,expected", [
    ("typo", "rewards.py has no function 'corectness' named in harness.yaml"),
    ("length", "reward 'correctness' returned 11 values for 12 completions"),
    ("yaml", "is not valid YAML at line"),
    ("nan", "reward 'answer_format' returned a non-finite or non-number value: nan"),
    ("import", "harness code failed to import: ZeroDivisionError"),
])
def test_validate_reports_one_line_per_problem(tmp_path, case, expected):
    def edit(h):
        y, r = h / "harness.yaml", h / "rewards.py"
        if case == "typo":
            y.write_text(y.read_text().replace("name: correctness", "name: corectness"))
        elif case == "length":
            r.write_text(r.read_text().replace("    return out\n", "    return out[:-1]\n"))
        elif case == "yaml":
            y.write_text(y.read_text().replace("rewards:", "rewards: [", 1))
        elif case == "nan":
            r.write_text(r.read_text() + "\n\ndef answer_format(prompts, completions, **kw):\n"
                                         "    return [float('nan')] * len(completions)\n")
        else:
            r.write_text("1 / 0\n" + r.read_text())
    proc = run_cli("validate", str(_harness(tmp_path, edit)))
    assert proc.returncode == 1
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and expected in lines[0], proc.stderr


def test_validate_passes_the_template_and_contains_a_hang(tmp_path):
    proc = run_cli("validate", str(TEMPLATES / "math"))
    assert proc.returncode == 0 and "is valid" in proc.stdout
    from evotrainer.trainer import jobs
    from evotrainer.trainer.sandbox import Limits

    h = _harness(tmp_path, lambda h: (h / "rewards.py").write_text(
        (h / "rewards.py").read_text() + "\nwhile True:\n    pass\n"))
    # stopped by its CPU seconds (the limit validation decides on), long before the wall clock's backstop of 3x
    problems = jobs.validate_harness(h, tmp_path, label="cand/g1-loop", limits=Limits.by_cpu(2))
    assert len(problems) == 1 and problems[0].startswith("cand/g1-loop: timed out: used its 2 CPU seconds (in "), \
        problems


def test_cli_init_branches_show(tmp_path):
    run = tmp_path / "run"
    assert run_cli("init", "--domain", "math", str(run)).returncode == 0
    again = run_cli("init", "--domain", "math", str(run))
    assert again.returncode == 2 and "is not empty" in again.stderr
    ws = RunWorkspace.open(run)
    branch, wt = ws.harness.create_candidate(1, "clip higher", ws.path / "worktrees")
    y = wt / "harness.yaml"
    y.write_text(y.read_text().replace("epsilon_high: 0.28", "epsilon_high: 0.32"))
    ws.harness.commit(wt, "Raise the clip-higher bound", intervention_id="i1", factor="trainer.epsilon_high",
                      hypothesis="if epsilon_high is 0.32, entropy stays higher because rare tokens can grow",
                      generation=1)
    ws.harness.reject(branch, 1, "dev fell")
    listed = last_json(run_cli("branches", str(run), "--json").stdout)
    assert [(b["branch"], b["status"], b["reason"]) for b in listed] == [(branch, "rejected", "dev fell")]
    shown = run_cli("show", str(run), branch)
    assert shown.returncode == 0
    assert "+  epsilon_high: 0.32" in shown.stdout and "entropy stays higher" in shown.stdout
    missing = run_cli("show", str(run), "cand/g7-nope")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    not_run = run_cli("branches", str(tmp_path))
    assert not_run.returncode == 2 and "not an EvoTrainer run" in not_run.stderr
    a_file = run_cli("validate", str(run / "run.yaml"))  # a file where a harness directory belongs: said so
    assert a_file.returncode == 2 and "is a file: pass the directory that holds harness.yaml" in a_file.stderr
    assert "`evotrainer init --force`" in again.stderr  # the command that has the option the message names


@pytest.mark.parametrize("body,reason,words", [
    ("    while True:\n        pass\n", "timeout", "timed out after 3s"),
    ("    x = bytearray(8 * 1024**3)\n    return [0.0] * len(completions)\n", "memory", "memory"),
    ("    import os, signal\n    os.kill(os.getpid(), signal.SIGKILL)\n", "crash", "killed by SIGKILL"),
])
def test_a_misbehaving_reward_function_is_contained(tmp_path, body, reason, words):
    from evotrainer.trainer import jobs
    from evotrainer.trainer.sandbox import Limits

    def edit(h):
        r = h / "rewards.py"
        r.write_text(r.read_text() + "\n\ndef answer_format(prompts, completions, **kw):\n" + body)
    problems = jobs.validate_harness(_harness(tmp_path, edit), tmp_path, label="cand/g1-bad",
                                     limits=Limits(timeout_s=3, memory_mb=2048))
    assert len(problems) == 1 and problems[0].startswith("cand/g1-bad: ") and words in problems[0], problems
