"""`--executor ray`: a loop generation's short-run arms run as Ray tasks on a local Ray instance started by the run,
and give the verdicts the local executor gives for the same seeds; an orchestrator killed mid-backtest leaves no
training child behind, and its resume redoes no finished arm."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evotrainer.base.errors import UserError
from evotrainer.trainer import executor, jobs
from tests.conftest import last_json, run_cli

LOOP = ["--generations", "1", "--candidates", "1", "--train-steps", "2", "--backtest-steps", "2", "--seeds", "1",
        "--max-seeds", "1", "--dev-items", "50", "--json"]


def test_bad_executor_settings_are_one_clear_error():
    with pytest.raises(UserError, match="choose local or ray"):
        executor.configure("slurm")
    with pytest.raises(UserError, match="--ray-address is for --executor ray"):
        executor.configure("local", "127.0.0.1:6379")
    assert executor.current().name == "local"


def _fails(message: str) -> None:
    raise UserError(message)


def _where(x: int) -> tuple[int, int]:
    return os.getpid(), x


def test_a_ray_task_runs_elsewhere_and_its_failure_is_the_jobs_own(tiny_policy, tmp_path):
    # two copies of the policy, no evaluation cached beside either: each evaluation below starts its child
    a, b = (shutil.copytree(tiny_policy, tmp_path / name / "policy", ignore=shutil.ignore_patterns("evals"))
            for name in ("a", "b"))
    before = executor.current().jobs["sealed_evaluation"]
    here = jobs.evaluate(a, "math", "dev", tmp_path / "local", k=0, limit=8)
    assert executor.current().jobs["sealed_evaluation"] == before + 1  # the local executor counts what it runs
    ex = executor.configure("ray")
    try:
        pid, x = ex.call("probe", _where, 7, cpus=1)
        assert x == 7 and pid != os.getpid()  # a Ray worker ran it
        with pytest.raises(UserError, match="^the arm failed$"):  # not wrapped in Ray's traceback
            ex.call("probe", _fails, "the arm failed")
        # a sealed evaluation's child, started by a Ray worker: the same typed result as here
        there = jobs.evaluate(b, "math", "dev", tmp_path / "ray", k=0, limit=8)
        assert ex.jobs == {"probe": 2, "sealed_evaluation": 1}
        assert (there.greedy_correct, there.item_ids) == (here.greedy_correct, here.item_ids)
    finally:
        ex.ray.shutdown()
        executor.configure("local")


def _verdicts(run: Path) -> dict:
    out = {}
    for path in sorted((run / "reports").glob("verdict-*.json")):
        v = json.loads(path.read_text())
        out[path.name] = (v["decision"], v["effect"], v["ci_low"], v["ci_high"])
    return out


def _arms(run: Path) -> dict[str, float]:
    """Each finished arm's checkpoint, by its path in the run, with the time it was written."""
    return {str(p.parent.relative_to(run)): p.stat().st_mtime_ns
            for p in (run / "backtests").glob("g1/*/*/checkpoints/policy/meta.json")}


@pytest.mark.slow
def test_ray_arms_match_local_and_a_killed_run_resumes_without_redoing_an_arm(tiny_policy, tmp_path):
    common = ["--checkpoint", str(tiny_policy), *LOOP]
    local = tmp_path / "local"
    proc = run_cli("run", str(local), "--skills", str(tmp_path / "s-local"), *common)
    assert proc.returncode == 0, proc.stderr[-3000:]

    ray_run = tmp_path / "ray"
    cmd = [sys.executable, "-m", "evotrainer.cli", "run", str(ray_run), "--skills", str(tmp_path / "s-ray"),
           "--executor", "ray", *common]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.time() + 600
    try:
        while not _arms(ray_run):  # the first arm finished by a Ray task; the others are still training
            assert proc.poll() is None, f"the run ended before an arm finished: {proc.stderr.read()[-2000:]}"
            assert time.time() < deadline, "no arm finished within 10 minutes"
            time.sleep(0.5)
        os.kill(proc.pid, signal.SIGKILL)  # the orchestrator alone: Ray and the training children must follow
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    finished = _arms(ray_run)
    for _ in range(60):  # Ray's reaper ends the instance, its workers' children their lifelines
        orphans = subprocess.run(["pgrep", "-f", f"grpo .*{ray_run}"], capture_output=True, text=True).stdout.split()
        if not orphans:
            break
        time.sleep(0.5)
    assert not orphans, "a training child survived its orchestrator"

    res = run_cli("resume", str(ray_run), "--executor", "ray", "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    assert last_json(res.stdout)["finished"]
    events = [json.loads(line) for line in (ray_run / "events.jsonl").read_text().splitlines()]
    assert [e["executor"] for e in events if e["event"] in ("run_start", "resume")] == ["ray", "ray"]
    end = [e for e in events if e["event"] == "run_end"][-1]  # the resume's: the arm it trained was a Ray task
    assert end["executor"] == "ray" and end["jobs"].get("short_run_arm", 0) >= 1
    local_end = [json.loads(line) for line in (local / "events.jsonl").read_text().splitlines()][-1]
    # every child of the loop went through the executor: the main line, sealed dev, the replay, the arms
    assert local_end["event"] == "run_end" and local_end["executor"] == "local"
    assert {"training", "sealed_evaluation", "replay"} <= set(local_end["jobs"])
    assert local_end["jobs"]["short_run_arm"] >= 2  # each arm (a finished one asked again is only scored)
    after = _arms(ray_run)
    assert all(after[arm] == written for arm, written in finished.items())  # not one finished arm trained again
    assert len(after) == len(_arms(local)) == 2  # the control's arm and the candidate's
    for arm in after:  # trained by a Ray worker's children under bubblewrap, as here
        assert json.loads((ray_run / arm / "meta.json").read_text())["isolation"] == "bwrap"
    assert _verdicts(ray_run) == _verdicts(local) and _verdicts(local)
