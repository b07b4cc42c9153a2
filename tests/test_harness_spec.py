import shutil

import pytest

from evotrainer.base.errors import UserError
from evotrainer.trainer.harness import TRAINER_DEFAULTS, TRAINER_KEYS, TRAINER_TYPES, load_spec
from evotrainer.workspaces import TEMPLATES


@pytest.fixture
def harness(tmp_path):
    dest = tmp_path / "h"
    shutil.copytree(TEMPLATES / "math", dest)
    return dest


def test_template_is_valid_and_states_the_reference_recipe():
    spec = load_spec(TEMPLATES / "math")
    t = spec.trainer
    assert spec.domain == "math"
    assert t["epsilon_high"] > t["epsilon"]  # clip-higher
    assert t["loss_type"] == "dapo" and t["beta"] == 0.0  # token-level loss, no KL
    assert [r.name for r in spec.rewards] == ["correctness", "answer_format"]
    assert spec.rewards[1].weight < spec.rewards[0].weight
    assert set(t) <= TRAINER_KEYS


def test_unknown_trainer_key_lists_the_valid_ones(harness):
    text = (harness / "harness.yaml").read_text().replace("beta: 0.0", "betta: 0.0")
    (harness / "harness.yaml").write_text(text)
    with pytest.raises(UserError, match=r"unknown trainer key 'betta'; valid keys are .*beta.*epsilon_high"):
        load_spec(harness)


def test_yaml_error_names_the_line(harness):
    (harness / "harness.yaml").write_text("domain: math\ntrainer: [unclosed\n")
    with pytest.raises(UserError, match=r"not valid YAML at line \d"):
        load_spec(harness)


def test_unknown_top_level_key_and_bad_batch(harness):
    text = (harness / "harness.yaml").read_text()
    (harness / "harness.yaml").write_text(text + "\nrewardz: []\n")
    with pytest.raises(UserError, match="rewardz"):
        load_spec(harness)
    (harness / "harness.yaml").write_text(text.replace("per_device_train_batch_size: 256",
                                                       "per_device_train_batch_size: 100"))
    with pytest.raises(UserError, match="must be a multiple of trainer.num_generations"):
        load_spec(harness)


def test_missing_harness_file(tmp_path):
    with pytest.raises(UserError, match="has no harness.yaml"):
        load_spec(tmp_path)


def test_harness_commit_only_for_the_root_of_a_repository(harness):
    import subprocess

    from evotrainer.workspaces.repo import harness_commit

    assert harness_commit(harness) == ""
    git = ["git", "-C", str(harness), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "gen-0"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert harness_commit(harness) == head
    assert harness_commit(harness / "diagnostics") == ""
    assert harness_commit(TEMPLATES / "math") == ""  # inside the package's checkout, not a harness repository


def test_trainer_types_agree_with_trl_grpo_config():
    """The parent's table of knob types is TRL's own: the same type for every whitelisted key, null allowed only
    where GRPOConfig allows None."""
    import dataclasses
    import typing

    from trl import GRPOConfig

    hints = typing.get_type_hints(GRPOConfig)
    assert TRAINER_KEYS <= {f.name for f in dataclasses.fields(GRPOConfig)}
    none = type(None)
    for key, ours in TRAINER_TYPES.items():
        theirs = set(typing.get_args(hints[key]) or (hints[key],))
        # lr_scheduler_type is `SchedulerType | str` (a str enum); generation_kwargs' `str` is the CLI's JSON form
        theirs = {str if isinstance(t, type) and issubclass(t, str) else t for t in theirs}
        if key == "generation_kwargs":
            theirs.discard(str)
        mine = set(typing.get_args(ours) or (ours,))
        assert mine - {none} == theirs - {none}, key
        assert none not in mine or none in theirs, key
    assert set(TRAINER_DEFAULTS) <= TRAINER_KEYS


@pytest.mark.parametrize("line, message", [
    ("learning_rate: fast", "trainer.learning_rate must be a number, got 'fast'"),
    ("learning_rate: 1e-4", r"trainer.learning_rate must be a number, got '1e-4' \(YAML 1.1 reads 1e-4 as text: "
                            r"write 1.0e-4\)"),
    ("beta: true", "trainer.beta must be a number, got True"),
    ("num_generations: 8.0", "trainer.num_generations must be an integer, got 8.0"),
    ("num_generations: null", "trainer.num_generations must be an integer, got None"),
    ("per_device_train_batch_size: '256'", "trainer.per_device_train_batch_size must be an integer, got '256'"),
    ("mask_truncated_completions: 1", "trainer.mask_truncated_completions must be true or false, got 1"),
    ("loss_type: 3", "trainer.loss_type must be a string, got 3"),
    ("generation_kwargs: [1]", r"trainer.generation_kwargs must be a mapping or null, got \[1\]"),
    ("epsilon_high: high", "trainer.epsilon_high must be a number or null, got 'high'"),
])
def test_bad_trainer_values_name_the_file_key_value_and_type(harness, line, message):
    _set_trainer_line(harness, line)
    with pytest.raises(UserError, match=rf"harness\.yaml: {message}$"):
        load_spec(harness)


@pytest.mark.parametrize("line", ["epsilon_high: null", "beta: 0", "warmup_steps: 5", "generation_kwargs: {top_k: 5}",
                                  "learning_rate: 5.0e-5", "mask_truncated_completions: yes"])
def test_good_trainer_values_pass(harness, line):
    import yaml

    _set_trainer_line(harness, line)
    ((key, value),) = yaml.safe_load(line).items()
    assert load_spec(harness).trainer[key] == value


def _set_trainer_line(harness, line: str) -> None:
    """Replace the template's `trainer.<key>` line (or add one) with `line`."""
    key = line.split(":")[0]
    lines = [x for x in (harness / "harness.yaml").read_text().splitlines() if not x.startswith(f"  {key}:")]
    lines.insert(lines.index(next(x for x in lines if x.startswith("trainer:"))) + 1, f"  {line}")
    (harness / "harness.yaml").write_text("\n".join(lines) + "\n")


def test_the_batch_check_and_the_backend_share_one_default(harness, tmp_path):
    """Without per_device_train_batch_size, training uses TRAINER_DEFAULTS' 128: a group of 16 fits, one of 48 does
    not; the GRPO backend's config and the offline catalog read the same default."""
    from evotrainer.agents.offline.catalog import apply
    from evotrainer.trainer.grpo import TrainSpec, grpo_config

    text = (harness / "harness.yaml").read_text()
    lines = [x for x in text.splitlines() if not x.startswith(("  per_device_train_batch_size:", "  num_generations:",
                                                               "                                    #"))]
    assert "per_device_train_batch_size" not in "\n".join(lines)
    (harness / "harness.yaml").write_text("\n".join(lines).replace("trainer:", "trainer:\n  num_generations: 16", 1))
    assert load_spec(harness).trainer["num_generations"] == 16  # 8 was the old check's default: refused 16
    (harness / "harness.yaml").write_text("\n".join(lines).replace("trainer:", "trainer:\n  num_generations: 48", 1))
    with pytest.raises(UserError, match=r"per_device_train_batch_size \(128\) must be a multiple of "
                                        r"trainer.num_generations \(48\)"):
        load_spec(harness)
    for ng in (1, 0):
        _set_trainer_line(harness, f"num_generations: {ng}")
        with pytest.raises(UserError, match=f"num_generations must be at least 2.*got {ng}"):
            load_spec(harness)

    paths = {k: str(tmp_path / k) for k in ("out_dir", "checkpoints_dir", "evidence_dir", "result_path")}
    spec = TrainSpec(domain="math", checkpoint="none", harness_dir=str(harness), steps=1, checkpoint_id="c", **paths)
    cfg = grpo_config(spec, {"num_generations": 16}, [1.0])
    assert (cfg.per_device_train_batch_size, cfg.num_generations) == (TRAINER_DEFAULTS["per_device_train_batch_size"],
                                                                        16)
    assert (cfg.max_completion_length, cfg.learning_rate) == (TRAINER_DEFAULTS["max_completion_length"],
                                                              TRAINER_DEFAULTS["learning_rate"])
    files = {"harness.yaml": "\n".join(lines) + "\n"}  # num_generations 8, batch left out: 16 still divides 128
    (harness / "harness.yaml").write_text(apply("more_generations", files, []).files["harness.yaml"])
    assert load_spec(harness).trainer["num_generations"] == 16
