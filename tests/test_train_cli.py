"""End to end through the real CLI: warm policy -> sealed eval -> GRPO with evidence -> sealed eval."""

import shutil
from pathlib import Path

import pytest

from evotrainer.trainer.domains import get_domain
from evotrainer.trainer.evidence import read_rollouts, read_steps
from evotrainer.trainer.harness import load_spec
from evotrainer.workspaces import TEMPLATES

from .conftest import last_json, run_cli

pytestmark = pytest.mark.slow  # every test needs the warm policy, most the trained one
STEPS = 4
BATCH = load_spec(TEMPLATES / "math").trainer["per_device_train_batch_size"]  # completions per step
GROUP = load_spec(TEMPLATES / "math").trainer["num_generations"]


@pytest.fixture(scope="module")
def trained(tiny_policy, tmp_path_factory):
    out = tmp_path_factory.mktemp("train") / "run"
    proc = run_cli("train", "--domain", "math", "--steps", str(STEPS), "--seed", "0", "--out", str(out),
                   "--checkpoint", str(tiny_policy), "--eval-limit", "300", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, last_json(proc.stdout)


def test_train_prints_one_json_summary(trained):
    out, res = trained
    for key in ("dev_before", "dev_after", "dev_before_avg", "dev_after_avg", "checkpoint", "evidence", "seconds"):
        assert key in res
    assert res["steps"] == STEPS and res["dev_items"] == 300
    assert 0.0 <= res["dev_before"] <= 1.0 and 0.0 <= res["dev_after_avg"] <= 1.0
    assert (out / "checkpoints").is_dir() and res["checkpoint"].startswith(str(out))


def test_training_curves_are_in_tensorboard_under_the_run(trained):
    """TRL's curves of every logged step, read back with TensorBoard's own event reader from where the parent keeps
    them (the child's directory is gone): the reward and the KL under the names TRL users know."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, res = trained
    assert not (out / "child").exists()
    (events,) = (out / "tensorboard").glob("events.out.tfevents.*")
    acc = EventAccumulator(str(events))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "train/reward" in tags, tags
    reward = acc.Scalars("train/reward")
    assert [e.step for e in reward] == list(range(1, STEPS + 1))
    steps = read_steps(res["evidence"]).to_pandas()
    assert [e.value for e in reward] == pytest.approx(steps.reward.tolist(), abs=1e-5)
    assert "train/kl" not in tags  # TRL logs a KL only where the harness sets a KL penalty: below


def test_a_kl_penalty_adds_its_curve(tiny_policy, tmp_path):
    import shutil

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from evotrainer.agents.offline.edits import set_knob

    harness = tmp_path / "harness"
    shutil.copytree(TEMPLATES / "math", harness)
    (harness / "harness.yaml").write_text(set_knob((harness / "harness.yaml").read_text(), "beta", 0.05))
    proc = run_cli("train", "--domain", "math", "--steps", "2", "--seed", "0", "--out", str(tmp_path / "run"),
                   "--harness", str(harness), "--checkpoint", str(tiny_policy), "--eval-limit", "10",
                   "--eval-k", "0", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (events,) = (tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*")
    acc = EventAccumulator(str(events))
    acc.Reload()
    kl = acc.Scalars("train/kl")
    assert [e.step for e in kl] == [1, 2] and all(e.value >= 0 for e in kl)
    steps = read_steps(last_json(proc.stdout)["evidence"]).to_pandas()
    assert [e.value for e in kl] == pytest.approx(steps.kl.tolist(), abs=1e-6)


def test_gpu_check_runs_its_cpu_branch_here(tiny_policy, tmp_path):
    """benchmarks/gpu_check.sh on a machine without a GPU: the same training command on the CPU, its summary line."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(["bash", str(root / "benchmarks" / "gpu_check.sh"), str(tiny_policy), "1",
                           str(tmp_path / "gpu")], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "no usable CUDA device" in proc.stdout
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("cpu ")]
    assert " 1 steps in " in line and "steps/s" in line and "dev " in line
    assert (tmp_path / "gpu" / "cpu" / "result.json").is_file()


def test_a_gpu_is_asked_for_where_there_is_none(tmp_path):
    for args, message in ((["--device", "cuda"], "torch sees no CUDA device"),
                          (["--vllm"], "--vllm generates on a GPU: add --device cuda"),
                          (["--device", "tpu"], "--device 'tpu': choose cpu or cuda")):
        proc = run_cli("train", "--out", str(tmp_path / "o"), *args)
        assert proc.returncode == 2 and message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
        assert not (tmp_path / "o").exists()


def test_evidence_has_one_row_per_rollout_graded_by_the_sealed_scorer(trained):
    out, res = trained
    rows = read_rollouts(res["evidence"]).to_pandas()
    assert len(rows) == STEPS * BATCH  # steps x completions per step
    assert sorted(rows.step.unique()) == list(range(1, STEPS + 1))
    assert rows.groupby("group_id").size().eq(GROUP).all()
    assert rows.rollout_id.is_unique
    math = get_domain("math")
    train_tasks = {t.id: t for t in math.tasks("train", 20_000, seed=0)}
    recomputed = [math.score(r.completion, train_tasks[r.prompt_id].answer, train_tasks[r.prompt_id].fmt)
                  for r in rows.itertuples()]
    assert rows.correct.tolist() == recomputed
    # the total reward is the weighted sum of the components (weights 1.0 and 0.1 in the template)
    total = rows.reward_correctness * 1.0 + rows.reward_answer_format * 0.1
    assert (abs(rows.reward - total) < 1e-5).all()
    assert rows.truncated.eq(rows.loss_masked).all()  # template masks truncated completions
    # log-probabilities come from the loss's own forward pass: none for completions masked out of it
    assert (rows.mean_logprob[~rows.loss_masked] < 0).all()
    assert rows.mean_logprob[rows.loss_masked].isna().all()
    steps = read_steps(res["evidence"]).to_pandas()
    assert steps.step.tolist() == list(range(1, STEPS + 1))
    assert {"reward", "reward_std", "frac_zero_std", "entropy", "grad_norm"} <= set(steps.columns)


def test_eval_matches_dev_after_and_rerun_is_idempotent(trained, tiny_policy):
    out, res = trained
    shutil.rmtree(Path(res["checkpoint"]) / "evals")  # no cached result: greedy decoding must reproduce it
    proc = run_cli("eval", "--checkpoint", res["checkpoint"], "--domain", "math", "--split", "dev", "--limit", "300",
                   "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert last_json(proc.stdout)["accuracy"] == res["dev_after"]
    again = run_cli("train", "--domain", "math", "--steps", str(STEPS), "--seed", "0", "--out", str(out),
                    "--checkpoint", str(tiny_policy), "--eval-limit", "300", "--json")
    assert again.returncode == 0 and last_json(again.stdout) == res
    other = run_cli("train", "--domain", "math", "--steps", str(STEPS + 1), "--seed", "0", "--out", str(out),
                    "--checkpoint", str(tiny_policy), "--eval-limit", "300", "--json")
    assert other.returncode == 2 and "holds another training run" in other.stderr


@pytest.mark.parametrize("case", ["domain", "harness_key", "checkpoint", "out", "split"])
def test_bad_input_is_one_clear_line(case, tmp_path, tiny_policy):
    args = ["train", "--steps", "2", "--out", str(tmp_path / "o"), "--checkpoint", str(tiny_policy), "--json"]
    expect = {
        "domain": "unknown domain 'chess'",
        "harness_key": "unknown trainer key 'learning_rat'",
        "checkpoint": "not found or not a model directory",
        "out": "is not writable",
        "split": "unknown split 'train'",
    }[case]
    if case == "domain":
        args += ["--domain", "chess"]
    elif case == "harness_key":
        h = tmp_path / "h"
        shutil.copytree(TEMPLATES / "math", h)
        y = h / "harness.yaml"
        y.write_text(y.read_text().replace("learning_rate:", "learning_rat:"))
        args += ["--harness", str(h)]
    elif case == "checkpoint":
        args[args.index("--checkpoint") + 1] = str(tmp_path / "missing")
    elif case == "out":
        (tmp_path / "file").write_text("x")
        args[args.index("--out") + 1] = str(tmp_path / "file" / "o")
    else:
        args = ["eval", "--checkpoint", str(tiny_policy), "--split", "train"]
    proc = run_cli(*args)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and expect in lines[0], proc.stderr


def test_diagnose_reads_the_training_evidence(trained, tmp_path):
    from evotrainer.trainer.diagnostics.report import HealthReport

    out, res = trained
    proc = run_cli("diagnose", str(out), "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = HealthReport.model_validate_json(proc.stdout.strip().splitlines()[-1])
    assert report.n_rollouts == STEPS * BATCH and report.n_steps == STEPS
    assert abs(report.summary["reward_mean"] - read_rollouts(res["evidence"]).column("reward").to_pandas().mean()) \
        < 1e-6
    text = run_cli("diagnose", str(out))
    assert text.returncode == 0 and "Health report" in text.stdout
    bad = tmp_path / "evidence" / "g0" / "main"
    bad.mkdir(parents=True)
    (bad / "rollouts-0000001.parquet").write_text("garbage")
    proc = run_cli("diagnose", str(tmp_path))
    assert proc.returncode == 2 and "is corrupt" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_mean_logprob_is_the_sampling_policys(trained, tiny_policy):
    """Step-1 rollouts were sampled from the starting policy: recomputing their log-probabilities with it must
    give the recorded values, row by row (this checks the row mapping through TRL's shuffle of the batch)."""
    import torch

    from evotrainer.trainer.policy import load_policy

    out, res = trained
    rows = read_rollouts(res["evidence"]).to_pandas()
    rows = rows[(rows.step == 1) & ~rows.loss_masked].head(40)
    model, tok = load_policy(tiny_policy)
    for r in rows.itertuples():
        p = tok(r.prompt, add_special_tokens=False)["input_ids"]
        c = tok(r.completion, add_special_tokens=False)["input_ids"]
        c = (c + [tok.eos_token_id])[: r.n_tokens]
        with torch.no_grad():
            logits = model(torch.tensor([p + c])).logits[0, len(p) - 1: len(p) + len(c) - 1]
        lp = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(c).unsqueeze(1)).mean().item()
        assert abs(lp - r.mean_logprob) < 1e-3, (r.rollout_id, lp, r.mean_logprob)


@pytest.mark.parametrize("args,message", [
    (["run"], "Missing argument 'directory'"),
    (["--bogus"], "No such option: --bogus"),
    (["frobnicate"], "No such command 'frobnicate'"),
    (["run", "x", "--generations", "abc"], "Invalid value for '--generations'"),
    (["compare", "--seeds", "0"], "Invalid value for '--seeds'"),
    (["skills", "query"], "Missing argument"),
])
def test_a_usage_error_is_one_line_and_exit_2(args, message, tmp_path):
    """Whatever copy of click typer raises from (typer >= 0.26 carries its own), a usage error is one `error:` line
    naming the command's --help, exit status 2, no traceback, nothing created."""
    res = run_cli(*args, cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip() and "DeprecationWarning" not in line]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0] and "--help" in lines[0], lines
    assert not any(tmp_path.iterdir())
