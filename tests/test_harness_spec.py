import shutil

import pytest

from evotrainer.base.errors import UserError
from evotrainer.trainer.harness import TRAINER_KEYS, load_spec
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
