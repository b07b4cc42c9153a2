"""Bad input through the real command line, in-process: one `error:` line, exit 2 (1 for a harness that `validate`
finds invalid), no traceback, and no file created or changed. A table of cases across the commands, then a fuzz
test (Hypothesis) of the command line and of the run.yaml / harness.yaml loaders.

In-process (`evotrainer.cli.main` with its own argv) so that forty cases cost seconds, not forty interpreter starts;
every case fails before any training or child process could start.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evotrainer.base.errors import UserError
from evotrainer.cli import main
from evotrainer.workspaces import TEMPLATES

NOT_UTF8 = b"domain: math\ntrainer:\n  learning_rate: 1.0e-4 # \xff\xfe caf\xe9\n"


def invoke(argv: list[str], capsys, monkeypatch) -> tuple[int, list[str]]:
    """Exit status and the non-empty stderr lines of `evotrainer ARGV`."""
    monkeypatch.setattr(sys, "argv", ["evotrainer", *argv])
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err
    return exit_.value.code or 0, [line for line in err.splitlines() if line.strip()
                                   and "Warning" not in line]


def snapshot(root: Path) -> dict[str, str]:
    """Every path under `root` with a digest of its bytes (directories as such)."""
    out = {}
    for p in sorted(root.rglob("*")):
        out[str(p.relative_to(root))] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """Paths a user might pass by mistake: a file, an empty folder, a run made by `init` (never started), a run
    whose run.yaml is broken or not UTF-8, harnesses with a bad key or bad bytes, a slice of evidence."""
    from evotrainer.workspaces.run import RunWorkspace

    w = tmp_path_factory.mktemp("world", numbered=True)
    (w / "file.txt").write_text("not a directory\n")
    (w / "empty").mkdir()
    RunWorkspace.create(w / "fresh", "math")
    for name, text in (("broken", b"domain: [math\n"), ("latin1", NOT_UTF8)):
        shutil.copytree(w / "fresh", w / name)
        (w / name / "run.yaml").write_bytes(text)
    shutil.copytree(TEMPLATES / "math", w / "badkey")
    y = w / "badkey" / "harness.yaml"
    y.write_text(y.read_text().replace("learning_rate:", "learning_rat:"))
    shutil.copytree(TEMPLATES / "math", w / "badbytes")
    (w / "badbytes" / "harness.yaml").write_bytes(NOT_UTF8)
    slice_ = w / "trained" / "evidence" / "g0" / "main"
    slice_.mkdir(parents=True)
    (slice_ / "rollouts-0000001.parquet").write_bytes(b"PAR1")
    (w / "patch.diff").write_bytes(b"--- a/x\n+++ b/x\n\xff\n")
    return w


# (argv with {w} for the world, the exit status, a part of the one error line)
CASES = [
    # run
    (["run", "{w}/new", "--checkpoint", "{w}/nope"], 2, "not found or not a model directory"),
    (["run", "{w}/file.txt"], 2, "file"),
    (["run", "{w}/fresh", "--generations", "2"], 2, "made by `evotrainer init`"),
    (["run", "{w}/new", "--harness", "{w}/missing"], 2, "missing"),
    (["run", "{w}/new", "--harness", "{w}/file.txt"], 2, "file.txt"),
    (["run", "{w}/new", "--harness", "{w}/badbytes"], 2, "not UTF-8"),
    (["run", "{w}/new", "--harness", "{w}/badkey"], 2, "unknown trainer key 'learning_rat'"),
    (["run", "{w}/new", "--domain", "chess"], 2, "chess"),
    (["run", "{w}/new", "--llm-cost", "abc"], 2, "--llm-cost"),
    (["run", "{w}/new", "--generations", "0"], 2, "--generations"),
    (["run", "{w}/broken"], 2, "not a valid run configuration"),
    (["run", "{w}/latin1"], 2, "not UTF-8"),
    # init
    (["init", "{w}/empty/../file.txt"], 2, "file"),
    (["init", "{w}/fresh"], 2, "not empty"),
    (["init", "{w}/new", "--domain", "chess"], 2, "chess"),
    (["init", "{w}/new", "--harness", "{w}/badbytes"], 2, "not UTF-8"),
    # resume
    (["resume", "{w}/missing"], 2, "not an EvoTrainer run"),
    (["resume", "{w}/fresh"], 2, "has not started yet: start it with `evotrainer run"),
    (["resume", "{w}/file.txt"], 2, "file.txt"),
    (["resume", "{w}/broken"], 2, "not a valid run configuration"),
    (["resume", "{w}/latin1"], 2, "not UTF-8 text (byte 0xff at line 3)"),
    # inspecting a run
    (["branches", "{w}/missing"], 2, "not an EvoTrainer run"),
    (["branches", "{w}/file.txt"], 2, "file.txt"),
    (["show", "{w}/fresh", "cand/g1-nothing"], 2, "cand/g1-nothing"),
    (["report", "{w}/empty"], 2, "not an EvoTrainer run"),
    (["report", "{w}/broken"], 2, "not a valid run configuration"),
    (["report", "{w}/fresh", "--out", "{w}/empty"], 2, "is a directory: pass --out FILE.html"),
    (["analyze", "{w}/empty", "--out", "{w}/an"], 2, "not an EvoTrainer run"),
    (["analyze", "{w}/fresh", "{w}/broken", "--out", "{w}/an"], 2, "not a valid run configuration"),
    (["diagnose", "{w}/empty"], 2, "no rollout evidence"),
    (["diagnose", "{w}/trained/evidence/g0/main"], 2, "--generation 0 --branch main"),
    (["backtest", "{w}/fresh", "cand/g1-nothing"], 2, "cand/g1-nothing"),
    (["propose", "{w}/fresh", "--patch", "{w}/patch.diff", "--factor", "x", "--hypothesis", "y"], 2, "not UTF-8"),
    (["propose", "{w}/fresh", "--patch", "{w}/empty", "--factor", "x", "--hypothesis", "y"], 2, "is a directory"),
    (["validate-analyzer", "{w}/missing", "{w}/empty"], 2, "not an EvoTrainer run"),
    # harnesses
    (["validate", "{w}/missing"], 2, "does not exist"),
    (["validate", "{w}/file.txt"], 2, "is a file"),
    (["validate", "{w}/badkey"], 1, "unknown trainer key"),
    (["validate", "{w}/badbytes"], 1, "not UTF-8"),
    # training and evaluation
    (["train", "--steps", "0"], 2, "--steps"),
    (["train", "--domain", "chess", "--out", "{w}/new"], 2, "chess"),
    (["train", "--processes", "999", "--out", "{w}/new"], 2, "--processes 999: choose 1 to"),
    (["train", "--processes", "0", "--out", "{w}/new"], 2, "--processes 0: choose 1 to"),
    (["eval", "--split", "bogus"], 2, "unknown split 'bogus'"),
    (["eval", "--split", "dev"], 2, "exactly one of --checkpoint"),
    # compare
    (["compare", "--arms", "bogus", "--out", "{w}/new"], 2, "bogus"),
    (["compare", "--domain", "chess", "--out", "{w}/new"], 2, "chess"),
    (["compare", "--harness", "{w}/missing", "--out", "{w}/new"], 2, "missing"),
    (["compare", "--budget", "huge", "--out", "{w}/new"], 2, "huge"),
    (["compare", "--arms", "evotrainer,evotrainer_llm", "--meta-llm", "openai/x", "--api-base",
      "http://127.0.0.1:9/v1", "--out", "{w}/new"], 2, "meta-LLM openai/x at http://127.0.0.1:9/v1 failed"),
    (["run", "{w}/new", "--meta-llm", "local", "--api-base", "http://127.0.0.1:9/v1"], 2, "drop --api-base"),
    # skill memory
    (["skills", "import", "{w}/patch.diff", "--skills", "{w}/store"], 2, "not UTF-8"),
    (["skills", "import", "{w}/empty", "--skills", "{w}/store"], 2, "is a directory"),
    (["skills", "list", "--skills", "{w}/file.txt"], 2, "is a file"),
    (["skills", "list", "--skills", "{w}/store", "--embedding", "bogus"], 2,
     "unknown embedding 'bogus': choose one of minilm, hashing"),
    # usage
    (["frobnicate"], 2, "No such command"),
    (["run"], 2, "Missing argument"),
]


@pytest.mark.parametrize(("argv", "status", "message"), CASES, ids=[" ".join(c[0][:2]) + f"-{i}"
                                                                   for i, c in enumerate(CASES)])
def test_bad_input_is_one_error_line_and_changes_nothing(argv, status, message, world, capsys, monkeypatch):
    monkeypatch.chdir(world / "empty")
    before = snapshot(world)
    code, lines = invoke([a.replace("{w}", str(world)) for a in argv], capsys, monkeypatch)
    assert code == status, lines
    first = "invalid:" if status == 1 else "error:"
    assert lines and all(line.startswith(first) for line in lines) and (status == 1 or len(lines) == 1), lines
    assert message in " ".join(lines), lines
    assert not any("Traceback" in line for line in lines)
    assert snapshot(world) == before


def test_the_table_covers_every_command():
    from evotrainer.cli import app

    commands = {c.name or c.callback.__name__ for c in app.registered_commands}
    covered = {argv[0] for argv, _, _ in CASES}
    assert len(CASES) >= 30 and commands - {"skills"} <= covered | {"eval_cmd"}, commands - covered


# -- fuzz -------------------------------------------------------------------------------------------------------

TOKENS = st.sampled_from(["run", "init", "resume", "branches", "show", "diagnose", "validate", "--domain", "math",
                          "code", "chess", "--generations", "-1", "0", "abc", "--harness", "--seed", "--json",
                          "--llm-cost", "1,2", "--checkpoint", "--generation", "--branch", "main", "--", "-", "",
                          "{w}/file.txt", "{w}/empty", "{w}/missing", "{w}/broken", "{w}/latin1", "{w}/fresh",
                          "{w}/badkey", "{w}/badbytes", "{w}/trained", "\x00", "é", "{w}/fresh/run.yaml"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=st.lists(TOKENS, min_size=1, max_size=6))
def test_fuzzed_command_lines_never_show_a_traceback(argv, world, capsys, monkeypatch):
    """Any sequence of the commands that never train, their options and awkward paths: exit 0, 1 or 2 and no
    traceback; nothing changes under the world. `init` with valid arguments creates a run (the table covers it), and
    `run` would train: every fuzzed `run` ends with a checkpoint that does not exist."""
    if argv[0] == "init":
        return
    if argv[0] == "run":
        argv = [*argv, "--checkpoint", "{w}/missing"]
    monkeypatch.chdir(world / "empty")  # a relative path lands in the world, where a change is seen
    before = snapshot(world)
    code, lines = invoke([a.replace("{w}", str(world)) for a in argv], capsys, monkeypatch)
    assert code in (0, 1, 2), (argv, lines)
    assert not any("Traceback" in line for line in lines), (argv, lines)
    if code:
        assert lines and lines[0].startswith(("error:", "invalid:")), (argv, lines)
    assert snapshot(world) == before, argv


YAML_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                       max_size=3), max_leaves=8)
KEYS = st.sampled_from(["domain", "trainer", "rewards", "filters", "analyzers", "seed", "budget", "loop", "harness",
                        "learning_rate", "num_generations", "weight", "x"])


def _documents():
    structured = st.dictionaries(KEYS, YAML_VALUES, max_size=4).map(lambda d: yaml.safe_dump(d).encode())
    return structured | st.binary(max_size=80) | st.text(max_size=80).map(str.encode)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=_documents())
def test_fuzzed_harness_yaml_is_a_user_error_or_a_spec(doc, tmp_path):
    from evotrainer.trainer.harness import load_spec

    (tmp_path / "harness.yaml").write_bytes(doc)
    try:
        load_spec(tmp_path)
    except UserError as e:
        assert str(e) and "\n" not in str(e).strip()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=_documents())
def test_fuzzed_run_yaml_is_a_user_error_or_a_config(doc, world, tmp_path):
    from evotrainer.workspaces.run import RunWorkspace

    run = tmp_path / "r"
    if not run.exists():
        shutil.copytree(world / "fresh", run)
    (run / "run.yaml").write_bytes(doc)
    try:
        RunWorkspace.open(run).config()
    except UserError as e:
        assert str(e) and "\n" not in str(e).strip()


def test_init_then_run_starts_the_run_and_resume_before_it_creates_nothing(world, tmp_path, capsys, monkeypatch):
    """The way out of `init`: `run DIR` starts it with its run.yaml (the loop tests drive such a run, made by
    `RunWorkspace.create` as `init` makes it); `resume` before that names `run` and leaves no file behind."""
    import evotrainer.cli as cli

    run = tmp_path / "r"
    shutil.copytree(world / "fresh", run)
    before = snapshot(run)
    code, lines = invoke(["resume", str(run)], capsys, monkeypatch)
    assert code == 2 and f"start it with `evotrainer run {run}`" in lines[0]
    assert snapshot(run) == before  # no graph.sqlite, no lock file
    started = []
    monkeypatch.setattr(cli, "_drive", lambda ws, fresh, as_json, meta=None: started.append((ws.path, fresh, as_json)))
    assert invoke(["run", str(run), "--json"], capsys, monkeypatch)[0] == 0
    assert started == [(run.resolve(), True, True)]
    # once its graph has a checkpoint, `run` refuses and names `resume`
    from evotrainer.graph.build import checkpointer, has_started

    saver = checkpointer(run / "graph.sqlite")
    assert not has_started(run)  # tables, no checkpoint: a start that failed before its first node
    saver.put({"configurable": {"thread_id": "evotrainer", "checkpoint_ns": ""}},
              {"v": 1, "id": "1ef0", "ts": "2026-01-01T00:00:00+00:00", "channel_values": {}, "channel_versions": {},
               "versions_seen": {}}, {}, {})
    saver.conn.close()
    assert has_started(run)
    code, lines = invoke(["run", str(run)], capsys, monkeypatch)
    assert code == 2 and f"continue it with `evotrainer resume {run}`" in lines[0]
