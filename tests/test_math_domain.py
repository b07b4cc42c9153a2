import json

import pytest

from evotrainer.trainer.domains import fingerprint, get_domain
from evotrainer.trainer.domains.base import prompt_hash
from evotrainer.trainer.evaluate import SEALED_FILE, SealedError, check_sealed

math = get_domain("math")


def test_splits_are_large_disjoint_and_deterministic():
    dev, test = math.tasks("dev"), math.tasks("test")
    train = math.tasks("train", 20_000, seed=3)
    assert len(dev) >= 2000 and len(test) >= 2000
    hashes = {s: {prompt_hash(t.prompt) for t in tasks} for s, tasks in
              (("dev", dev), ("test", test), ("train", train))}
    assert not hashes["dev"] & hashes["test"]
    assert not hashes["train"] & (hashes["dev"] | hashes["test"])
    assert [t.id for t in math.tasks("dev")] == [t.id for t in dev]
    assert [t.id for t in math.tasks("train", 50, seed=3)] == [t.id for t in train[:50]]
    assert [t.id for t in math.tasks("train", 50, seed=4)] != [t.id for t in train[:50]]


def test_mixture_has_five_levels_with_most_mass_in_the_middle():
    dev = math.tasks("dev")
    share = {lvl: sum(t.difficulty == lvl for t in dev) / len(dev) for lvl in range(1, 6)}
    assert all(v >= 0.1 for v in share.values())
    assert share[2] + share[3] >= 0.5 * 0.99  # the learnable middle band (DESIGN §12)
    # word problems need the required answer line, and more characters than a careless limit of 12
    word = [t for t in dev if t.difficulty == 5]
    assert all(t.fmt == "tagged" and t.target.endswith(f"Answer: {t.answer}") for t in word)
    assert min(len(t.target) for t in word) > 12


def test_targets_are_correct_under_the_sealed_scorer():
    for t in math.tasks("dev") + math.tasks("train", 2000, seed=0):
        assert math.score(t.target, t.answer, t.fmt), t


@pytest.mark.parametrize("completion,answer,fmt,ok", [
    ("65", "65", "bare", True),
    (" 65 ", "65", "bare", True),
    ("065", "65", "bare", True),
    ("65 apples", "65", "bare", False),
    ("", "65", "bare", False),
    ("6+5=65", "65", "bare", False),
    ("47+23=70\n70-8=62\nAnswer: 62", "62", "tagged", True),
    ("47+23=70\n70-8=62\n62", "62", "tagged", False),  # the required format is missing
    ("Answer: 62\nAnswer: 61", "62", "tagged", False),  # the final answer counts
    ("Answer:", "0", "tagged", False),
    ("Answer: -3", "-3", "tagged", True),
])
def test_sealed_scorer(completion, answer, fmt, ok):
    assert math.score(completion, answer, fmt) is ok


def test_fingerprint_is_recorded_and_detects_a_changed_scorer(monkeypatch):
    recorded = json.loads(SEALED_FILE.read_text())["math"]
    assert check_sealed(math) == recorded == fingerprint(math)
    with pytest.raises(SealedError, match="sealed scorer of domain 'math' changed"):
        check_sealed(math, expected="0" * 32)
    # changing the sealed data changes the fingerprint
    import evotrainer.trainer.domains.math as m

    monkeypatch.setitem(m.LEVEL_WEIGHTS, 2, 0.31)
    monkeypatch.setitem(m.LEVEL_WEIGHTS, 3, 0.19)
    assert fingerprint(math) != recorded
    with pytest.raises(SealedError):
        check_sealed(math)


def test_every_domains_recorded_fingerprint_is_its_scorers():
    """sealed.json holds each domain's live fingerprint: an edit of a sealed source (a docstring included) without
    recording it again makes every sealed evaluation of that domain refuse to run."""
    from evotrainer.trainer.domains import DOMAINS

    recorded = json.loads(SEALED_FILE.read_text())
    for name in DOMAINS:
        assert recorded[name] == fingerprint(get_domain(name)), (
            f"{name}'s sealed sources changed since trainer/domains/sealed.json was recorded; if the change is meant, "
            "record it again (docs/architecture.md, the domains row)")


def test_data_fingerprint_ignores_code_but_not_data(monkeypatch):
    from evotrainer.trainer.domains.base import data_fingerprint

    before = data_fingerprint(math)
    import evotrainer.trainer.domains.math as m

    monkeypatch.setitem(m.LEVEL_WEIGHTS, 2, 0.41)
    monkeypatch.setitem(m.LEVEL_WEIGHTS, 3, 0.24)
    assert data_fingerprint(math) != before
