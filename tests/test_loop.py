"""The co-evolution loop end to end on the tiny policy: `evotrainer run` with the offline meta-policy, a SIGKILL
during a backtest and `evotrainer resume`, and the run's refusals. Real children, git, Chroma and SqliteSaver."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from evotrainer.agents.offline.catalog import CATALOG
from evotrainer.agents.offline.policy import OfflinePolicy
from evotrainer.agents.schemas import Intervention, Verdict
from evotrainer.graph.build import drive
from evotrainer.graph.events import EventLog
from evotrainer.graph.lessons import lesson_of
from evotrainer.memory.distill import distill
from evotrainer.memory.store import SkillStore
from evotrainer.trainer.diagnostics import Finding
from evotrainer.workspaces.run import RunWorkspace

from .browser import check_report
from .conftest import last_json, run_cli

TINY_LOOP = ["--train-steps", "2", "--backtest-steps", "2", "--seeds", "1", "--max-seeds", "1", "--dev-items", "50"]


def _args(run: Path, policy: Path, skills: Path, generations: int, candidates: int) -> list[str]:
    return ["run", str(run), "--checkpoint", str(policy), "--skills", str(skills), "--generations", str(generations),
            "--candidates", str(candidates), *TINY_LOOP, "--json"]


def _ends(run: Path) -> Counter:
    return Counter((e["node"], e["generation"]) for e in EventLog(run / "events.jsonl").read() if e["event"] == "end")


def _worktrees(run: Path) -> list[str]:
    out = subprocess.run(["git", "-C", str(run / "harness"), "worktree", "list", "--porcelain"], capture_output=True,
                         text=True, check=True).stdout
    return [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("worktree ")]


@pytest.mark.slow
def test_offline_run_two_generations(tiny_policy, tmp_path):
    run, skills = tmp_path / "run", tmp_path / "skills"
    proc = run_cli(*_args(run, tiny_policy, skills, 2, 2))
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = last_json(proc.stdout)
    assert summary["finished"] and summary["stop_reason"] == "2 generations done"
    assert summary["meta_policy"] == "offline rule-based meta-policy" and summary["generations"] == 2
    # every node of both generations ran exactly once
    ends = _ends(run)
    for g in (1, 2):
        for node in ("train", "diagnose", "plan", "implement", "backtest", "critique", "promote", "distill"):
            assert ends[(node, g)] == 1, (node, g)
    branches = json.loads(run_cli("branches", str(run), "--json").stdout)
    assert len(branches) >= 3 and all(b["status"] != "open" for b in branches)
    for b in branches:
        assert b["factor"] and b["hypothesis"].startswith("If ")
        if b["status"] in ("rejected", "inconclusive"):
            assert b["reason"]
        verdict = json.loads((run / "reports" / f"verdict-{b['branch'].replace('/', '--')}.json").read_text())
        assert verdict["author"] == "offline rule-based meta-policy" and verdict["branch"] == b["branch"]
        assert (run / "reports" / f"backtest-{b['branch'].replace('/', '--')}.json").is_file() or \
            "backtest failed" in b["reason"]
    # one factor per generation is never proposed twice on the same champion
    for g in (1, 2):
        factors = [b["factor"] for b in branches if b["generation"] == g]
        assert len(factors) == len(set(factors))
    assert summary["steps_used"] >= 2 * 2 + 2 * 2  # champion steps of 2 generations + at least the arms of one
    assert SkillStore(skills).list() and summary["skills"] == len(SkillStore(skills).list())
    assert _worktrees(run) == [str((run / "harness").resolve())]
    assert (run / "reports" / "summary.md").is_file() and (run / "reports" / "plan-g2.json").is_file()
    # a finished run: `run` again is refused, `resume` has nothing left to do
    again = run_cli(*_args(run, tiny_policy, skills, 2, 2))
    assert again.returncode == 2 and "evotrainer resume" in again.stderr
    done = run_cli("resume", str(run), "--json")
    assert done.returncode == 0 and last_json(done.stdout)["finished"]
    assert _ends(run) == ends
    # `fresh=None` (compare's loop arms) reads the graph checkpoint: a started run is resumed, not refused or redone
    resumed = drive(RunWorkspace.open(run), OfflinePolicy(), fresh=None)
    assert resumed.finished and resumed.stop_reason == summary["stop_reason"] and _ends(run) == ends
    assert [e["event"] for e in EventLog(run / "events.jsonl").read()].count("resume") == 2

    # a later run with the same store: a transform validated positive elsewhere comes first, and nothing the
    # store recorded as negative after the same findings is proposed again
    store = SkillStore(skills)
    negative = {(s.transform, tuple(s.trigger.analyzers)) for s in store.list(outcome="negative")}
    used = {s.transform for s in store.list()}
    proven = next(t for t in ("scale_rewards", "temperature", "more_iterations", "loss_type") if t not in used)
    health = json.loads((run / "reports" / "health-g1-main.json").read_text())
    diag = json.loads((run / "reports" / "diagnosis-g2.json").read_text())
    elsewhere = Intervention(id="elsewhere", hypothesis="If X, dev improves", factor=CATALOG[proven].factor,
                             change=CATALOG[proven].summary, transform=proven)
    distill(store, lesson_of(elsewhere, Verdict(branch="cand/g1-elsewhere", decision="promote", effect=0.03,
                                                ci_low=0.01, ci_high=0.05), "math",
                             findings=[Finding(**f) for f in health["findings"]], diagnosis=diag["summary"],
                             run="another-run", commit="0" * 40))
    second = run_cli(*_args(tmp_path / "second", tiny_policy, skills, 1, 1))  # its first proposal is what counts
    assert second.returncode == 0, second.stderr[-3000:]
    plan = json.loads((tmp_path / "second" / "reports" / "plan-g1.json").read_text())
    diagnosis = json.loads((tmp_path / "second" / "reports" / "diagnosis-g1.json").read_text())
    now = tuple(sorted({b["findings"][0].split(":")[0] for b in diagnosis["bottlenecks"]
                        if b["severity"] != "info"}))
    assert not [iv for iv in plan["interventions"] if (iv["transform"], now) in negative]
    assert plan["interventions"][0]["transform"] == proven
    assert any(src.startswith("sk-") for src in plan["interventions"][0]["sources"])
    assert sum(s.retrieved for s in SkillStore(skills).list()) > 0

    # the HTML report: `run` and `resume` wrote it; `report` names every candidate branch, one dev point a generation,
    # and refers to nothing outside the page
    assert (run / "reports" / "report.html").is_file() and "report: " in done.stderr
    proc = run_cli("report", str(run), "--out", str(tmp_path / "report.html"))
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "report.html").read_text()
    assert all(f'id="{b["branch"]}"' in page for b in branches)
    assert page.count('class="dev-point"') == 2
    assert not re.search(r"https?://|\bsrc=|\bhref=", page)
    check_report(tmp_path / "report.html", [b["branch"] for b in branches], tmp_path / "report.png")  # in Chromium


@pytest.mark.slow
def test_sigkill_during_backtest_then_resume(tiny_policy, tmp_path):
    run, skills = tmp_path / "run", tmp_path / "skills"
    cmd = [sys.executable, "-m", "evotrainer.cli", *_args(run, tiny_policy, skills, 1, 1)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    try:
        while time.time() < deadline:  # wait until a short-run arm is training
            started = any(e["event"] == "start" and e.get("node") == "backtest"
                          for e in EventLog(run / "events.jsonl").read())
            # a child that has written its first line is past its start; a kill within milliseconds of a start can
            # still leave bubblewrap behind under load (benchmarks/bench_orphans.py measures how often)
            if started and any(p.stat().st_size for p in (run / "backtests").glob("g1/*/*/logs/train-*.log")):
                break
            assert proc.poll() is None, "the run ended before its backtest"
            time.sleep(0.5)
        else:
            pytest.fail("no backtest started within 10 minutes")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    for _ in range(30):  # SIGKILL reaches every child at once; a loaded machine takes a moment to tear them down
        orphans = subprocess.run(["pgrep", "-f", f"grpo .*{run}"], capture_output=True, text=True).stdout.split()
        if not orphans:
            break
        time.sleep(0.5)
    assert not orphans, "a training child survived its orchestrator"
    before = _ends(run)
    assert before[("implement", 1)] == 1 and before[("backtest", 1)] == 0
    # the report of the killed run shows what it has: its candidate, open, with its diff
    assert run_cli("report", str(run), "--out", str(tmp_path / "killed.html")).returncode == 0
    assert 'badge open">open (not judged yet)' in (tmp_path / "killed.html").read_text()
    pending = [b["branch"] for b in json.loads(run_cli("branches", str(run), "--json").stdout)]
    check_report(tmp_path / "killed.html", pending, tmp_path / "killed.png")

    res = run_cli("resume", str(run), "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    assert last_json(res.stdout)["finished"]
    after = _ends(run)
    events = EventLog(run / "events.jsonl").read()
    starts = Counter((e["node"], e["generation"]) for e in events if e["event"] == "start")
    for node in ("train", "diagnose", "plan", "implement"):  # completed before the kill: not redone
        assert starts[(node, 1)] == 1 and after[(node, 1)] == 1
    assert starts[("backtest", 1)] == 2 and after[("backtest", 1)] == 1
    assert all(after[(n, 1)] == 1 for n in ("critique", "promote", "distill"))
    assert [e["event"] for e in events].count("resume") == 1
    assert _worktrees(run) == [str((run / "harness").resolve())] and not any((run / "worktrees").iterdir())
    branches = json.loads(run_cli("branches", str(run), "--json").stdout)
    assert branches and all(b["status"] != "open" for b in branches)


def test_run_refuses_bad_input(tmp_path):
    proc = run_cli("run", str(tmp_path / "r"), "--checkpoint", str(tmp_path / "nope"), "--json")
    assert proc.returncode == 2 and "not found or not a model directory" in proc.stderr
    assert not (tmp_path / "r").exists()
    proc = run_cli("resume", str(tmp_path / "missing"))
    assert proc.returncode == 2 and "not an EvoTrainer run" in proc.stderr
