"""The evidence schema documents itself: every field carries a description (Parquet field metadata) in the files
written and read, the domain columns are the ones the real graders produce, and the README's and
docs/architecture.md's tables are the ones the schema generates."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from evotrainer.base.errors import UserError
from evotrainer.trainer import evidence as ev
from evotrainer.trainer.domains import DOMAINS, get_domain, grade_all
from evotrainer.trainer.evidence import DOMAIN_SCHEMA, ROLLOUT_SCHEMA, STEP_SCHEMA, EvidenceWriter, read_steps

ROOT = Path(__file__).resolve().parents[1]


def described(field: pa.Field) -> str:
    return (field.metadata or {}).get(ev.DESCRIPTION, b"").decode()


def test_every_field_of_every_schema_is_described():
    for schema in (ROLLOUT_SCHEMA, DOMAIN_SCHEMA, STEP_SCHEMA):
        for f in schema:
            text = described(f)
            assert len(text) > 10 and "|" not in text and "\n" not in text, f.name


def test_the_facts_a_data_person_asked_about_are_stated():
    assert {"completion_ids", "task", "formatted"} <= set(ROLLOUT_SCHEMA.names)
    assert "whole batch" in described(STEP_SCHEMA.field("reward_std"))
    assert "produces" in described(ROLLOUT_SCHEMA.field("checkpoint"))
    assert "empty" in described(ROLLOUT_SCHEMA.field("harness_commit"))
    assert "generation 1's champion training is stored under `g0`" in described(ROLLOUT_SCHEMA.field("generation"))
    assert "beta" in described(STEP_SCHEMA.field("kl"))  # a column only some harnesses write


def test_the_step_schema_is_what_training_logs():
    # grpo.py's Capture writes step, generation, branch and update_ratio, then ev.STEP_METRICS renamed (reward_* aside)
    assert set(STEP_SCHEMA.names) == {"step", "generation", "branch", "update_ratio", *ev.STEP_METRICS.values()}


def test_harness_commit_is_empty_for_a_template_and_the_commit_for_a_repository(tmp_path):
    from evotrainer.workspaces import TEMPLATES
    from evotrainer.workspaces.repo import harness_commit

    assert harness_commit(TEMPLATES / "math") == ""
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "PATH": "/usr/bin:/bin"}
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, env=env)
    (tmp_path / "harness.yaml").write_text("domain: math\n")
    subprocess.run(["git", "-C", str(tmp_path), "add", "."], check=True, env=env)
    subprocess.run(["git", "-C", str(tmp_path), "commit", "-qm", "x"], check=True, env=env)
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert harness_commit(tmp_path) == head


@pytest.fixture(scope="module")
def graded_columns() -> dict[str, list[dict]]:
    """Each domain's evidence columns, as its real sealed grader adds them to two train rollouts."""
    out = {}
    for name in DOMAINS:
        d = get_domain(name)
        tasks = d.tasks("train", 2)
        grades = grade_all(d, ["x+1", "submit"], [t.answer for t in tasks], [t.fmt for t in tasks],
                           [t.prompt for t in tasks])
        out[name] = [g.columns for g in grades]
    return out


def test_the_domain_schema_holds_exactly_the_columns_the_graders_add_with_their_types(graded_columns):
    declared = {c for d in DOMAINS for c in getattr(get_domain(d), "evidence_columns", ())}
    produced = {c for cols in graded_columns.values() for row in cols for c in row}
    assert set(DOMAIN_SCHEMA.names) == declared == produced
    for cols in graded_columns.values():
        if cols[0]:
            inferred = pa.Table.from_pylist(cols).schema
            for f in inferred:
                assert f.type == DOMAIN_SCHEMA.field(f.name).type, f.name


def _row(step: int, i: int, extra: dict) -> dict:
    row = {f.name: None for f in ROLLOUT_SCHEMA}
    row.update(rollout_id=f"r/g0/main/{step}:0:{i}", run="r", generation=0, branch="main", harness_commit="",
               checkpoint="c", step=step, prompt_id="p", group_id=f"{step}:0", sample_idx=i, difficulty=1,
               prompt="1+1=", completion="2", completion_ids=[5, 2], task="{}", n_tokens=2, truncated=False,
               reward=1.0, advantage=0.0, loss_masked=False, correct=True, formatted=True, mean_logprob=-0.1,
               reward_correctness=1.0, **extra)
    return row


def test_files_written_and_read_carry_a_description_on_every_field(tmp_path, graded_columns):
    w = EvidenceWriter(tmp_path, 0, "main")
    code_cols = graded_columns["code"]
    w.add_rollouts([_row(1, i, code_cols[i]) for i in range(2)])
    w.add_step({"step": 1, "generation": 0, "branch": "main", "update_ratio": 0.01, "reward": 0.5, "reward_std": 0.1,
                "frac_zero_std": 0.25, "reward_correctness": 0.5})
    w.flush(1)
    files = {p.name.split("-")[0]: p for p in (tmp_path / "g0" / "main").iterdir()}
    for kind, read in (("rollouts", ev.read_rollouts), ("steps", read_steps)):
        on_disk = pq.read_schema(files[kind])  # what any Parquet reader (pandas, DuckDB, polars) sees
        assert all(described(f) for f in on_disk), [f.name for f in on_disk if not described(f)]
        assert [described(f) for f in read(tmp_path).schema] == [described(f) for f in on_disk]
    rollouts = pq.read_schema(files["rollouts"])
    assert "reward function `correctness`" in described(rollouts.field("reward_correctness"))
    assert rollouts.field("exec_status").type == pa.string() and "sandbox status" in described(
        rollouts.field("exec_status"))
    assert described(pq.read_schema(files["steps"]).field("reward_std")) == described(STEP_SCHEMA.field("reward_std"))


def test_evidence_written_before_the_descriptions_reads_with_its_own_types_and_gains_them(tmp_path):
    d = tmp_path / "g0" / "main"
    d.mkdir(parents=True)
    pq.write_table(pa.table({"step": pa.array([1], pa.int32()), "reward": [0.5], "mystery": ["?"]}),
                   d / "steps-0000001.parquet")
    t = read_steps(tmp_path)
    assert t.schema.field("step").type == pa.int32() and t.column("reward").to_pylist() == [0.5]
    assert described(t.schema.field("reward")) and not described(t.schema.field("mystery"))


def test_the_readme_and_architecture_tables_are_the_ones_the_schema_generates():
    generated = ev.schema_markdown()
    for doc in ("README.md", "docs/architecture.md"):
        text = (ROOT / doc).read_text()
        assert text.count(ev.BEGIN) == text.count(ev.END) == 1, f"{doc}: one generated evidence schema block"
        block = text.split(ev.BEGIN, 1)[1].split(ev.END, 1)[0]
        assert block == "\n" + generated, (f"{doc} differs from the evidence schema: run `python -m "
                                           "evotrainer.trainer.evidence --write README.md docs/architecture.md`")
        assert text.count("stored under `g0`") == 1  # the generation numbering, stated once
        for f in [*ROLLOUT_SCHEMA, *DOMAIN_SCHEMA, *STEP_SCHEMA]:
            assert f"| `{f.name}` |" in block


def test_write_rewrites_a_stale_block_and_refuses_a_file_without_one(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(f"# Title\n\n{ev.BEGIN}\n| `kl` | stale |\n{ev.END}\n\nAfter.\n")
    assert ev.write_markdown(doc) is True and ev.write_markdown(doc) is False
    text = doc.read_text()
    assert text.startswith("# Title\n\n") and text.endswith(f"{ev.END}\n\nAfter.\n") and "stale" not in text
    assert ev.schema_markdown() in text
    plain = tmp_path / "plain.md"
    plain.write_text("no block\n")
    with pytest.raises(UserError, match="no evidence schema block"):
        ev.write_markdown(plain)


def test_the_markdown_command_prints_the_tables():
    proc = subprocess.run([sys.executable, "-m", "evotrainer.trainer.evidence", "--markdown"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout == ev.schema_markdown()
