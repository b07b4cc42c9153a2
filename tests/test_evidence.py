import pyarrow as pa
import pytest

from evotrainer.base.errors import UserError
from evotrainer.trainer.evidence import ROLLOUT_SCHEMA, EvidenceWriter, read_rollouts, read_steps


def _row(step: int, i: int, branch: str = "main") -> dict:
    row = {f.name: None for f in ROLLOUT_SCHEMA}
    row.update(rollout_id=f"r/{branch}/{step}:{i}", run="r", generation=0, branch=branch, harness_commit="abc",
               checkpoint="c", step=step, prompt_id=f"p{i}", group_id=f"{step}:{i // 2}", sample_idx=i % 2,
               difficulty=2, prompt="1+1=", completion="2", n_tokens=2, truncated=False, reward=1.0,
               advantage=0.5, loss_masked=False, correct=True, formatted=True, mean_logprob=-0.3,
               reward_correctness=1.0)
    return row


def test_roundtrip_chunks_branches_and_truncation(tmp_path):
    w = EvidenceWriter(tmp_path, 0, "main")
    for step in (1, 2, 3):
        w.add_rollouts([_row(step, i) for i in range(4)])
        w.add_step({"step": step, "reward": 0.1 * step})
        if step == 2:
            w.flush(2)
    w.flush(3)
    other = EvidenceWriter(tmp_path, 1, "cand/g1-x")
    other.add_rollouts([_row(1, i, "cand/g1-x") for i in range(2)])
    other.flush(1)

    t = read_rollouts(tmp_path)
    assert t.num_rows == 14
    assert t.schema.field("correct").type == pa.bool_() and "reward_correctness" in t.column_names
    assert read_rollouts(tmp_path, generation=0).num_rows == 12
    assert read_rollouts(tmp_path, branch="cand/g1-x").column("branch").to_pylist() == ["cand/g1-x"] * 2
    assert read_steps(tmp_path).column("step").to_pylist() == [1, 2, 3]

    w.truncate_after(2)  # a resume from checkpoint 2 drops what came after it
    assert sorted(read_rollouts(tmp_path, generation=0).column("step").to_pylist()) == [1] * 4 + [2] * 4
    w.add_step({"step": 2})
    with pytest.raises(FileExistsError):  # a chunk is never overwritten
        w.flush(2)


def test_exact_tags_never_pool_a_longer_run_of_the_same_commit(tmp_path):
    """A 5-step short-run arm and a 50-step one of the same commit and seed: a tag prefix reads both (a commit's
    whole history), a list of tags reads exactly the named arms."""
    for tag, steps in (("abc12345-s0-k5", 5), ("abc12345-s0-k50", 50), ("abc12345-s1-k5", 5)):
        w = EvidenceWriter(tmp_path, 1, "cand/g1-x", tag)
        w.add_rollouts([_row(steps, i, "cand/g1-x") for i in range(2)])
        w.flush(steps)
    assert read_rollouts(tmp_path, 1, "cand/g1-x", "abc12345").num_rows == 6
    exact = read_rollouts(tmp_path, 1, "cand/g1-x", ["abc12345-s0-k5", "abc12345-s1-k5"])
    assert exact.column("step").to_pylist() == [5] * 4
    assert read_rollouts(tmp_path, 1, "cand/g1-x", ["abc12345-s0-k50"]).column("step").to_pylist() == [50, 50]


def test_a_column_missing_from_the_first_row_is_kept(tmp_path):
    """A key that appears only in later rows (a metric TRL logs from some step on) is a column, None before it."""
    w = EvidenceWriter(tmp_path, 0, "main")
    w.add_step({"step": 1, "reward": 0.1})
    w.add_step({"step": 2, "reward": 0.2, "kl": 0.05})
    w.flush(2)
    assert read_steps(tmp_path).to_pylist() == [{"step": 1, "reward": 0.1, "kl": None},
                                                {"step": 2, "reward": 0.2, "kl": 0.05}]


def test_missing_columns_are_refused(tmp_path):
    w = EvidenceWriter(tmp_path, 0, "main")
    w.add_rollouts([{"rollout_id": "x"}])
    with pytest.raises(ValueError, match="lack columns"):
        w.flush(1)


def test_corrupt_and_missing_evidence_give_one_clear_error(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        read_rollouts(tmp_path / "nope")
    d = tmp_path / "g0" / "main"
    d.mkdir(parents=True)
    (d / "rollouts-0000001.parquet").write_bytes(b"not parquet")
    with pytest.raises(UserError, match="is corrupt"):
        read_rollouts(tmp_path)
