"""Backtests on a real run: planted reward bug, too-short length limit, dead-group filter; errors; statistics.

The run's champion is the tiny test policy, trained for a few steps on the math template with a larger
learning rate (so that a reward bug shows within a handful of steps). Candidates are real branches of
the run's harness repository; replays and short runs are real children.
"""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from evotrainer.base.config import loop_config
from evotrainer.base.errors import UserError
from evotrainer.trainer import jobs
from evotrainer.trainer.backtest import BacktestConfig, paired_bootstrap
from evotrainer.trainer.backtest.replay import REPLAY_GATE, agreement
from evotrainer.trainer.backtest.statistics import Z_POWER, backtest_interval, decide, resolution_se, with_seed_spread
from evotrainer.trainer.grpo import TrainSpec
from evotrainer.workspaces.repo import IDENTITY
from evotrainer.workspaces.run import RunWorkspace

from .conftest import run_cli

FAST = BacktestConfig(steps=8, seeds=1, max_seeds=1, dev_items=200, bootstrap=300)
BUG = ("1.0 if value is not None and value == int(expected) else 0.0",
       "1.0 if value is None or value == int(expected) else 0.0")  # an unparsable answer counts as right


def _commit_to_champion(ws: RunWorkspace, edit: dict[str, tuple[str, str]], message: str) -> None:
    for name, (old, new) in edit.items():
        path = ws.path / "harness" / name
        text = path.read_text()
        assert old in text, (name, old)
        path.write_text(text.replace(old, new))
    env = {**IDENTITY, "PATH": "/usr/bin:/bin"}
    subprocess.run(["git", "-C", str(ws.path / "harness"), "commit", "-qam", message], check=True, env=env)


def _candidate(ws: RunWorkspace, generation: int, name: str, edit: dict[str, tuple[str, str]],
               extra: dict[str, str] | None = None) -> str:
    repo = ws.harness
    branch, tree = repo.create_candidate(generation, name, ws.path / "worktrees")
    files = {}
    for rel, (old, new) in edit.items():
        text = (tree / rel).read_text()
        assert old in text, (rel, old)
        files[rel] = text.replace(old, new)
    repo.write_files(tree, {**files, **(extra or {})})
    repo.commit(tree, name, intervention_id=name, hypothesis=f"if we {name}, dev improves", factor=name,
                generation=generation)
    return branch


@pytest.fixture(scope="module")
def run(tiny_policy, tmp_path_factory) -> RunWorkspace:
    # one generation whose main line is 3 champion steps and an 8-step short run (FAST): the arms' horizon
    ws = RunWorkspace.create(tmp_path_factory.mktemp("bt") / "run", "math", budget={"generations": 1},
                             loop=loop_config("math", {"train_steps": 3, "backtest": {"steps": 5}}))
    _commit_to_champion(ws, {"harness.yaml": ("learning_rate: 1.0e-4", "learning_rate: 1.0e-3")},
                        "Test champion: a larger step so that effects show in a few steps")
    ws.set_champion(tiny_policy, 0)
    out = ws.path / "checkpoints" / "gen0"
    spec = TrainSpec(domain="math", checkpoint=str(tiny_policy), harness_dir=str(ws.path / "harness"), steps=3,
                     seed=0, out_dir=str(out), checkpoint_id="gen0", checkpoints_dir=str(ws.path / "checkpoints"),
                     evidence_dir=str(ws.path / "evidence"), run=ws.path.name, generation=0, branch="main",
                     harness_commit=ws.harness.head(), result_path=str(out / "result.json"))
    jobs.train(spec, ws.path)
    return ws


@pytest.mark.slow
def test_replay_of_a_reward_bug_trips_the_agreement_gate(run):
    branch = _candidate(run, 1, "lenient parser", {"rewards.py": BUG})
    res = run.backtest(branch, replay_only=True)
    r = res.replay
    assert r.n_rollouts == 3 * 256 and r.generations == [0] and r.branches == ["main"]
    # the bug pays unparsable answers: incorrect rollouts now earn what correct ones earn
    assert r.agreement_after.rewarded_incorrect > r.agreement_before.rewarded_incorrect + REPLAY_GATE[
        "rewarded_incorrect"]
    assert r.changed_fraction > 0.1 and r.reward_after.mean > r.reward_before.mean
    assert "replay_agreement" in res.failed_gates and res.short_run is None
    report = run.path / "reports" / f"backtest-{branch.replace('/', '--')}.json"
    assert json.loads(report.read_text())["failed_gates"] == res.failed_gates
    assert "**GATE** `replay_agreement`" in report.with_suffix(".md").read_text()


HACK = "\n\ndef brevity(prompts, completions, **kwargs):\n" \
       "    return [1.0 if len(c) < 3 else 0.0 for c in completions]\n"
FORMAT_LAST = "    return [1.0 if final_answer(c, f) is not None else 0.0 for c, f in zip(completions, fmt)]\n"


def _with_term(name: str, weight: float, source: str = HACK) -> dict[str, tuple[str, str]]:
    return {"rewards.py": (FORMAT_LAST, FORMAT_LAST + source),
            "harness.yaml": ("  - name: answer_format ",
                             f"  - name: {name}\n    weight: {weight}\n  - name: answer_format ")}


@pytest.mark.slow
def test_replay_gates_a_small_reward_hack_and_passes_harmless_changes(run):
    """A 0.02 bonus for short answers (unrelated to correctness) is gated by unsealed_preference on the stored
    rollouts; a constant bonus and a format weight change, on the same rollouts, are not gated at all."""
    hack = run.backtest(_candidate(run, 1, "brevity bonus", _with_term("brevity", 0.02)), replay_only=True,
                    write=False)
    assert hack.failed_gates == ["unsealed_preference"]
    term = next(t for t in hack.replay.unsealed.terms if t.term == "brevity")
    assert term.status == "new" and term.unsealed_fraction > 0.25 and term.after > term.before == 0.0
    constant = "\n\ndef bonus(prompts, completions, **kwargs):\n    return [1.0 for _ in completions]\n"
    harmless = {"constant bonus": _with_term("bonus", 0.3, constant),
                "format weight": {"harness.yaml": ("    weight: 0.1 ", "    weight: 0.15 ")}}
    for name, edit in harmless.items():
        res = run.backtest(_candidate(run, 1, name, edit), replay_only=True, write=False)
        assert res.failed_gates == [], (name, [f.message for f in res.replay.findings if f.gate])


def _diff(files: dict[str, str], changed: dict[str, str]) -> str:
    import difflib

    return "".join("".join(difflib.unified_diff(files.get(p, "").splitlines(True), t.splitlines(True),
                                                "/dev/null" if p not in files else f"a/{p}", f"b/{p}"))
                   for p, t in changed.items())


@pytest.mark.slow
def test_an_engineers_patch_goes_through_the_coders_path_and_the_rule(run, tmp_path):
    """`evotrainer propose` makes a candidate from a diff as the Coder does; `backtest --judge` ends with the rule's
    verdict. A patch outside the harness, one that does not apply and one that makes an invalid harness are each
    refused with one line, and leave no branch."""
    from evotrainer.agents.coder import harness_files

    files = harness_files(run.snapshot("main")[1])
    hack = {"rewards.py": files["rewards.py"] + HACK, "harness.yaml": files["harness.yaml"].replace(
        "  - name: answer_format ", "  - name: brevity\n    weight: 0.05\n  - name: answer_format ")}
    patch = tmp_path / "brevity.diff"
    patch.write_text(_diff(files, hack))
    made = run_cli("propose", str(run.path), "--patch", str(patch), "--factor", "reward.brevity", "--hypothesis",
                   "if short answers are paid, dev improves", "--name", "brevity by hand")
    assert made.returncode == 0, made.stderr
    rec = next(r for r in run.harness.lineage() if r.branch == "cand/g1-brevity-by-hand")
    assert rec.factor == "reward.brevity" and rec.hypothesis.startswith("if short answers")
    assert sorted(run.harness.changed_files(rec.branch)) == ["harness.yaml", "rewards.py"]
    judged = run_cli("backtest", str(run.path), rec.branch, "--replay-only", "--judge", "--json")
    verdict = json.loads(judged.stdout.strip().splitlines()[-1])["verdict"]
    assert verdict["decision"] == "reject" and verdict["failed_gates"] == ["unsealed_preference"]
    assert (run.path / "reports" / "verdict-cand--g1-brevity-by-hand.json").is_file()

    before = sorted(r.branch for r in run.harness.lineage())
    bad = {"sealed.diff": (_diff({}, {"trainer/domains/math.py": "x = 1\n"}), "not a harness file"),
           "stale.diff": (_diff({**files, "rewards.py": "nothing like the champion\n"},
                                {"rewards.py": "something else\n"}), "does not apply"),
           "invalid.diff": (_diff(files, {"harness.yaml": files["harness.yaml"].replace(
               "trainer:", "trainer:\n  bogus_knob: 1", 1)}), "invalid")}
    for name, (text, message) in bad.items():
        (tmp_path / name).write_text(text)
        res = run_cli("propose", str(run.path), "--patch", str(tmp_path / name), "--factor", "f", "--hypothesis", "h")
        assert res.returncode != 0 and message in res.stderr and "Traceback" not in res.stderr, (name, res.stderr)
    assert sorted(r.branch for r in run.harness.lineage()) == before


@pytest.mark.slow
def test_short_run_of_a_reward_bug_diverges_from_the_sealed_score_and_is_gated(run):
    """Planted scenario 1: train reward rises, the sealed correct rate does not, the divergence gate fires."""
    branch = _candidate(run, 1, "lenient parser short", {"rewards.py": BUG})
    screened = run.backtest(branch, cfg=FAST, write=False)  # the replay gates it: no short run is spent
    assert "replay_agreement" in screened.failed_gates and screened.short_run is None
    res = run.backtest(branch, cfg=FAST, screen=False)
    s = res.short_run
    cand = [a for a in s.arms if a.role == "candidate"][0]
    ctrl = [a for a in s.arms if a.role == "control"][0]
    assert s.train_reward_delta > 0.3  # the buggy reward pays far more ...
    assert s.train_correct_delta <= 0.0  # ... for answers that are no more correct
    assert cand.dev_accuracy <= ctrl.dev_accuracy and s.delta <= 0
    assert "shaped_vs_sealed" in s.failed_gates and "shaped_vs_sealed" in res.failed_gates
    assert s.stopped == "gate" and s.seeds == [0] and s.dev_items == 200
    assert s.ci_low <= s.delta <= s.ci_high and s.mde > 0
    assert 0 < cand.live_groups <= 1 and 0 < ctrl.live_groups <= 1  # groups whose rewards differ: each arm learned
    assert s.shapers == ["rewards"]  # its analyzers read rewards of its own: no fix of a defect can rest on them
    # both arms under both rewards: the changed correctness term pays the candidate's policy more among equally
    # correct rollouts, under the candidate's reward; under the champion's reward its rollouts earn no more
    c = s.cross
    assert c and c.rollouts == (8 * 256, 8 * 256) and c.reward_delta > 0.3 and c.reward_delta_champion <= 0.05
    bug = next(t for t in c.terms if t.harness == "candidate" and t.term == "correctness")
    assert bug.status == "changed" and bug.within_delta > 0.1
    assert "reward_divergence" in s.failed_gates


@pytest.mark.slow
def test_too_short_length_limit_is_critical_and_the_restoring_branch_is_not_flagged(run):
    """Planted scenario 2."""
    cfg = BacktestConfig(steps=3, seeds=1, max_seeds=1, dev_items=100, bootstrap=200)
    short = _candidate(run, 1, "short limit", {"harness.yaml": ("max_completion_length: 40",
                                                                 "max_completion_length: 4")})
    res = run.backtest(short, cfg=cfg)
    trunc = [f for f in res.short_run.findings if f.analyzer == "truncation"]
    assert trunc and trunc[0].severity == "critical" and trunc[0].value > 0.10
    assert "masked out of the loss" in trunc[0].message and trunc[0].evidence
    run.harness.promote(short, 1, {"effect": 0.0})  # suppose it had been promoted: the next branch restores it
    restore = _candidate(run, 2, "restore limit", {"harness.yaml": ("max_completion_length: 4",
                                                                     "max_completion_length: 40")})
    res = run.backtest(restore, cfg=cfg)
    # the tiny policy still rambles into a 40-token limit now and then (a warning); never a critical finding,
    # and far fewer completions cut than under the short limit
    after = [f for f in res.short_run.findings if f.analyzer == "truncation"]
    assert not [f for f in after if f.severity == "critical"]
    assert all(f.value < trunc[0].value / 2 for f in after)
    # what the Critic's fix rule reads: the defect in the control arms (the champion's short limit), and a change
    # that leaves what the analyzers read as it was
    assert res.short_run.control_defects["truncation/truncated_ratio"] == "critical" and res.short_run.shapers == []


@pytest.mark.slow
def test_dead_group_filter_replay_reports_the_groups_it_takes_out(run):
    """Planted scenario 3: the replay counts the zero-variance groups and what the filter does to them."""
    branch = _candidate(run, 3, "drop dead groups", {"harness.yaml": ("group_filters: []",
                                                                      "group_filters: [drop_dead_groups]")})
    r = run.backtest(branch, replay_only=True, generation=0).replay
    assert r.dead_groups_before > 0
    assert r.groups_dropped == r.dead_groups_dropped == r.dead_groups_before  # every dead group, no live one
    assert r.dead_ratio_before > 0 and r.dead_ratio_after == 0.0
    assert r.changed_fraction == 0.0 and not r.failed_gates


@pytest.mark.slow
def test_partial_credit_rescues_dead_groups_and_own_analyzers_run(run):
    partial = ("out.append(1.0 if value is not None and value == int(expected) else 0.0)",
               "out.append(1.0 if value is not None and value == int(expected) else "
               "0.3 * (len(completion) > 0 and completion.strip()[:1] == str(expected)[:1]))")
    own = ("from evotrainer.trainer.diagnostics import Finding, analyzer\n\n\n"
           "@analyzer('long_answers', share=0.01)\n"
           "def long_answers(r, s, t):\n"
           "    \"\"\"Completions longer than 3 tokens.\"\"\"\n"
           "    frac = float((r['n_tokens'] > 3).mean())\n"
           "    return [Finding(analyzer='long_answers', metric='long', value=frac, severity='warning',\n"
           "                    message='long answers')] if frac > t['share'] else []\n")
    branch = _candidate(run, 3, "partial credit", {"rewards.py": partial},
                        extra={"diagnostics/long_answers.py": own})
    r = run.backtest(branch, replay_only=True, generation=0).replay
    assert r.groups_rescued > 0 and r.dead_groups_after < r.dead_groups_before
    assert "long_answers" in {f.analyzer for f in r.findings}


@pytest.mark.slow
def test_errors_are_one_line_and_write_nothing(run):
    reports = run.path / "reports"
    with pytest.raises(UserError, match="not a candidate"):
        run.backtest("cand/g9-nope", replay_only=True)
    crash = ("def correctness(prompts, completions, answer, fmt, **kwargs):",
             "def correctness(prompts, completions, answer, fmt, **kwargs):\n"
             "    if len(completions) > 12:  # passes validation's small batch, fails on real evidence\n"
             "        raise ZeroDivisionError('planted crash')")
    branch = _candidate(run, 4, "crashing reward", {"rewards.py": crash})
    with pytest.raises(UserError, match="ZeroDivisionError: planted crash"):
        run.backtest(branch, replay_only=True, generation=0)
    assert not (reports / f"backtest-{branch.replace('/', '--')}.json").exists()
    proc = run_cli("backtest", str(run.path), "cand/g9-nope", "--replay-only")
    assert proc.returncode == 2 and proc.stderr.count("error:") == 1 and "not a candidate" in proc.stderr


@pytest.mark.slow
def test_corrupt_evidence_is_one_clear_error(run, tmp_path):
    branch = _candidate(run, 4, "answer format weight", {"harness.yaml": ("weight: 0.1", "weight: 0.2")})
    bad = run.path / "evidence" / "g7" / "main" / "rollouts-0000001.parquet"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"not parquet")
    try:
        with pytest.raises(UserError, match="corrupt"):
            run.backtest(branch, replay_only=True, generation=7)
    finally:
        bad.unlink()
    assert not (run.path / "reports" / f"backtest-{branch.replace('/', '--')}.json").exists()


def test_evidence_shapers_are_the_changes_to_what_the_analyzers_read(tmp_path):
    """Rewards, prompt filters and the harness's own analyzers decide what the analyzers read besides the policy;
    a recipe knob, a group filter (its rollouts stay in the evidence) or a threshold does not."""
    import shutil

    from evotrainer.trainer.backtest.arms import evidence_shapers
    from evotrainer.workspaces import TEMPLATES

    champ = shutil.copytree(TEMPLATES / "math", tmp_path / "champ")

    def changed(edit) -> list[str]:
        cand = tmp_path / "cand"
        shutil.rmtree(cand, ignore_errors=True)
        shutil.copytree(champ, cand)
        edit(cand)
        return evidence_shapers(cand, champ)

    def yaml_edit(old, new):
        def edit(d):
            text = (d / "harness.yaml").read_text()
            assert old in text, old
            (d / "harness.yaml").write_text(text.replace(old, new))
        return edit

    assert changed(lambda d: None) == []
    assert changed(yaml_edit("max_completion_length: 40", "max_completion_length: 80")) == []
    assert changed(yaml_edit("group_filters: []", "group_filters: [drop_dead_groups]")) == []
    assert changed(yaml_edit("dead_groups: {warning: 0.30", "dead_groups: {warning: 0.90")) == []
    assert changed(yaml_edit("    weight: 0.1", "    weight: 0.2")) == ["rewards"]
    assert changed(lambda d: (d / "rewards.py").write_text((d / "rewards.py").read_text() + "\n# x\n")) == ["rewards"]
    assert changed(yaml_edit("\nfilters: []", "\nfilters: [drop_long_prompts]")) == ["filters"]
    assert changed(lambda d: (d / "filters.py").write_text((d / "filters.py").read_text() + "\n# x\n")) == ["filters"]
    assert changed(lambda d: (d / "diagnostics" / "mine.py").write_text("# an analyzer of its own\n")) == \
        ["diagnostics"]


def test_paired_bootstrap_interval_and_power():
    rng = np.random.default_rng(0)
    zero = np.zeros((2, 500))
    assert paired_bootstrap(zero, 200) == (0.0, 0.0, 0.0, 0.0)
    better = (rng.random((2, 2000)) < 0.15).astype(float) - (rng.random((2, 2000)) < 0.05)
    mean, lo, hi, se = paired_bootstrap(better, 500)
    assert lo < mean < hi and lo > 0.05 and abs(mean - better.mean()) < 1e-12
    noisy = better[:, :200]
    assert paired_bootstrap(noisy, 500)[3] > 2 * se  # fewer dev items: a wider interval, a larger MDE
    # a seed that disagrees widens the interval beyond what the items alone would say
    split = np.stack([better[0], -better[1]])
    _, lo2, hi2, _ = paired_bootstrap(split, 500)
    assert lo2 < 0 < hi2


def test_one_seed_carries_the_training_seed_spread_its_items_cannot_show():
    """A one-seed backtest whose items agree perfectly still has a training seed's worth of uncertainty: its error
    is at least `seed_sd`, its interval straddles a small effect, and the rule cannot promote on items alone."""
    from evotrainer.agents.critic import posterior
    from evotrainer.memory.prior import Prior

    rng = np.random.default_rng(1)
    one = ((rng.random((1, 2000)) < 0.12).astype(float) - (rng.random((1, 2000)) < 0.10))
    delta, lo, hi, se = paired_bootstrap(one, 500)
    lo1, hi1, se1, ok = with_seed_spread(delta, lo, hi, se, 1, 0.006)
    assert ok and se1 == pytest.approx(np.hypot(se, 0.006)) and lo1 < lo and hi1 > hi
    assert hi1 - delta == pytest.approx(delta - lo1)
    assert with_seed_spread(delta, lo, hi, se, 2, 0.006) == (lo, hi, se, True)  # two seeds: the bootstrap sees it
    # one seed and no spread configured: nothing is estimable, the interval is the whole range of a difference
    assert with_seed_spread(delta, lo, hi, se, 1, 0.0) == (-1.0, 1.0, 1.0, False)
    # the worst case: every item of the one seed moved alike (se 0): on items alone +0.005 would be a certain gain
    assert posterior(0.005, 0.0, Prior.vague(0.02)).p_gain > 0.999
    lo0, hi0, se0, _ = with_seed_spread(0.005, 0.005, 0.005, 0.0, 1, BacktestConfig().seed_sd)
    assert se0 == BacktestConfig().seed_sd and lo0 < 0 < hi0
    assert posterior(0.005, se0, Prior.vague(0.02)).p_gain < 0.9


def test_few_items_that_all_agree_are_not_a_certainty():
    """Two seeds x 20 items where both arms agree on every item: the bootstrap's error is 0 and its interval a
    point, yet 20 items cannot exclude a discordance of 3/20. The floor keeps the MDE honest at that size and
    vanishes at the default dev size."""
    agree = np.zeros((2, 20))
    delta, lo, hi, se = paired_bootstrap(agree, 200)
    assert se == 0.0 and lo == hi == 0.0
    assert resolution_se(20) == pytest.approx(np.sqrt(3) / 20)
    assert Z_POWER * resolution_se(20) > 0.2  # at 20 items no effect below 0.2 is detectable
    assert resolution_se(2000) < 0.001  # the default dev split: below any bootstrap error seen
    d, lo, hi, se, ok = backtest_interval(agree, 200, 0.006)
    assert ok and d == 0.0 and se == pytest.approx(resolution_se(20)) and lo < -0.15 and hi > 0.15
    # one seed x 20 agreeing items (the issue's case): with the seed spread, wider still; without, not estimable
    _, lo1, hi1, se1, ok1 = backtest_interval(agree[:1], 200, 0.006)
    assert ok1 and se1 == pytest.approx(np.hypot(resolution_se(20), 0.006))
    assert backtest_interval(agree[:1], 200, 0.0)[1:] == (-1.0, 1.0, 1.0, False)
    # at the default size the floor changes nothing
    rng = np.random.default_rng(3)
    big = (rng.random((2, 2000)) < 0.3).astype(float) - (rng.random((2, 2000)) < 0.3)
    assert backtest_interval(big, 200, 0.006)[:4] == paired_bootstrap(big, 200)


def test_sequential_rule():
    assert decide(0.03, 0.01, 0.05, 2, 4, []) == "significant"
    assert decide(-0.04, -0.07, -0.01, 2, 4, []) == "worse"
    assert decide(-0.01, -0.03, 0.01, 2, 4, []) == "no_gain"
    assert decide(0.01, -0.01, 0.03, 2, 4, []) == ""  # promising but unresolved: extend
    assert decide(0.01, -0.01, 0.03, 4, 4, []) == "budget"
    assert decide(0.05, 0.02, 0.08, 2, 4, ["shaped_vs_sealed"]) == "gate"


def test_agreement_metrics():
    correct = np.array([1, 1, 0, 0, 0], dtype=bool)
    a = agreement(np.array([1.1, 1.1, 0.1, 0.1, 0.0]), correct)
    assert a.auc == 1.0 and a.rewarded_incorrect == 0.0 and a.corr > 0.9
    b = agreement(np.array([1.1, 1.1, 1.0, 0.1, 0.0]), correct)  # a wrong answer paid almost like a right one
    assert b.rewarded_incorrect == pytest.approx(1 / 3) and b.auc == 1.0  # AUC alone would not see it
    assert agreement(np.ones(3), np.ones(3, dtype=bool)).auc is None


@pytest.mark.slow
def test_new_analyzer_validated_on_history(run, tmp_path):
    """After the scenarios above, the run's history holds promoted and rejected branches."""
    repo = run.harness
    open_bug = [r.branch for r in repo.lineage() if r.branch.startswith("cand/g1-lenient-parser-short")][0]
    repo.reject(open_bug, 1, "failed gate shaped_vs_sealed")
    harness = tmp_path / "h"
    (harness / "diagnostics").mkdir(parents=True)
    (harness / "diagnostics" / "format_collapse.py").write_text(
        "from evotrainer.trainer.diagnostics import Finding, analyzer\n\n\n"
        "@analyzer('format_collapse', rate=0.3)\n"
        "def format_collapse(r, s, t):\n"
        "    \"\"\"The readable-answer rate in the last steps fell below `rate`.\"\"\"\n"
        "    late = r[r['step'] >= r['step'].max() - 1]\n"
        "    value = float(late['formatted'].mean())\n"
        "    return [Finding(analyzer='format_collapse', metric='late_format_rate', value=value,\n"
        "                    severity='critical', message='format collapsed')] if value < t['rate'] else []\n")
    res = run.validate_analyzers(harness)
    by = {s.branch: s for s in res.slices}
    assert by[open_bug].flagged and by[open_bug].status == "rejected"
    promoted = [s for s in res.slices if s.status == "promoted"]
    assert promoted and not any(s.flagged for s in promoted)
    assert res.recall == 1.0 and res.precision == 1.0 and res.false_alarms == 0
    proc = run_cli("validate-analyzer", str(run.path), str(harness), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["recall"] == 1.0


@pytest.mark.slow
def test_harness_analyzer_cannot_replace_a_built_in(run, tmp_path):
    from evotrainer.trainer.diagnostics.report import health_report

    harness = tmp_path / "h"
    (harness / "diagnostics").mkdir(parents=True)
    (harness / "harness.yaml").write_text((run.path / "harness" / "harness.yaml").read_text())
    (harness / "diagnostics" / "quiet.py").write_text(
        "from evotrainer.trainer.diagnostics import analyzer\n\n\n"
        "@analyzer('shaped_vs_sealed')\n"
        "def silenced(r, s, t):\n"
        "    return []\n")
    with pytest.raises(UserError, match="already registered"):
        health_report(run.path / "evidence", 0, "main", harness, tmp_path)


@pytest.mark.slow
def test_a_gate_the_stored_rollouts_already_fail_is_left_to_the_short_run(run):
    """Replay re-scores the champion's own rollouts: a gate they fail whatever the rewards (a behaviour, like a
    tool leak that an env.py edit would close) is inherited, not the candidate's failure."""
    always = ("from evotrainer.trainer.diagnostics import Finding, analyzer\n\n\n"
              "@analyzer('always_gated')\n"
              "def always_gated(r, s, t):\n"
              "    \"\"\"A behaviour every stored rollout shows.\"\"\"\n"
              "    return [Finding(analyzer='always_gated', metric='m', value=1.0, severity='critical', gate=True,\n"
              "                    message='stored behaviour')]\n")
    branch = _candidate(run, 4, "always gated", {}, extra={"diagnostics/always_gated.py": always})
    res = run.backtest(branch, replay_only=True, generation=0)
    assert res.replay.inherited_gates == ["always_gated"]
    assert "always_gated" not in res.failed_gates and "always_gated" in {f.analyzer for f in res.replay.findings}


@pytest.mark.slow
def test_a_repair_of_the_champions_gate_is_also_measured_against_the_starting_policy(run):
    """A champion whose own control arms fail a gate (here a lenient reward: shaped_vs_sealed) has a dev score that
    is not one to beat; the short run then scores the policy both arms started from, on the same items, so the
    Critic can tell a repair that trains the policy forward from one that loses ground."""
    import re

    yaml = (run.path / "harness" / "harness.yaml").read_text()
    yaml = re.sub(r"max_completion_length: \d+", "max_completion_length: 40", yaml)  # whatever earlier tests left
    bug = _candidate(run, 5, "lenient parser champion", {"rewards.py": BUG}, extra={"harness.yaml": yaml})
    run.harness.promote(bug, 5, {"effect": 0.0})
    fix = _candidate(run, 6, "strict parser", {"rewards.py": BUG[::-1]})
    res = run.backtest(fix, cfg=FAST)
    s = res.short_run
    assert s.control_gates == ["shaped_vs_sealed"] and not res.failed_gates
    start = jobs.evaluate(run.starting_policy(), "math", "dev", run.path, k=0, limit=FAST.dev_items, seed=0)
    cand = next(a for a in s.arms if a.role == "candidate")
    assert s.start_dev == start.accuracy
    assert s.start_delta == pytest.approx(cand.dev_accuracy - start.accuracy)
    assert s.start_ci_low <= s.start_delta <= s.start_ci_high
    assert f"[{s.ci_low:+.3f}, {s.ci_high:+.3f}]" in s.trace[-1]  # the candidate-vs-control interval is its own
    assert "The control arms fail gate shaped_vs_sealed" in res.markdown()
