"""Each built-in analyzer fires on crafted evidence that has its failure, and stays silent on healthy evidence."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from evotrainer.trainer.diagnostics import REGISTRY, Finding, run_all
from evotrainer.trainer.diagnostics.report import HealthReport, health_report, write_report
from evotrainer.trainer.evidence import EvidenceWriter

ROOT = Path(__file__).resolve().parents[1]


def healthy(steps: int = 12, groups: int = 8, g: int = 8, seed: int = 0) -> pd.DataFrame:
    """Rollouts of a policy that learns honestly: mixed groups, correct rising with the reward."""
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(1, steps + 1):
        p = 0.35 + 0.02 * step
        for grp in range(groups):
            level = 1 + grp % 4
            for i in range(g):
                ok = bool(rng.random() < p) if i < g - 1 else (i % 2 == 0)
                ok = ok if i > 0 else True  # every group has a success ...
                ok = ok if i != 1 else False  # ... and a failure: no dead groups
                n = int(rng.integers(3, 9))
                completion = str(42 + i) if ok else str(7 * i)
                rows.append(dict(
                    rollout_id=f"r/{step}:{grp}:{i}", step=step, group_id=f"{step}:{grp}", sample_idx=i,
                    difficulty=level, prompt="12+30=", completion=completion,
                    completion_ids=[ord(c) for c in completion], task=json.dumps({"answer": "42", "fmt": "bare"}),
                    n_tokens=n, truncated=False, loss_masked=False, correct=ok, formatted=True,
                    reward_correctness=float(ok), reward_answer_format=1.0, mean_logprob=-0.6 - 0.1 * rng.random()))
    df = pd.DataFrame(rows)
    df["reward"] = df.reward_correctness + 0.1 * df.reward_answer_format
    df["advantage"] = 0.0
    return df


def steps_of(df: pd.DataFrame) -> pd.DataFrame:
    s = df.groupby("step").agg(reward=("reward", "mean")).reset_index()
    s["grad_norm"], s["kl"], s["clip_ratio"], s["update_ratio"] = 0.1, 0.0, 0.0, 1e-3
    return s


def fired(df: pd.DataFrame, steps: pd.DataFrame | None = None) -> set[str]:
    return {f.analyzer for f in run_all(df, steps_of(df) if steps is None else steps)}


def test_healthy_evidence_fires_nothing():
    assert fired(healthy()) == set()


def crafted(kind: str) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    df, steps = healthy(), None
    if kind == "dead_groups":
        dead = df.group_id.str.endswith((":0", ":1", ":2", ":3", ":4"))
        df.loc[dead, ["correct", "reward_correctness"]] = [False, 0.0]
    elif kind == "reward_spread":
        df["reward"] = 0.5 + 0.001 * (df.sample_idx % 2)
    elif kind == "truncation":
        df.loc[df.sample_idx < 3, ["truncated", "loss_masked"]] = True
    elif kind == "length_reward_correlation":
        df["n_tokens"] = np.where(df.correct, 30, 5)
    elif kind == "logprob_collapse":
        df["mean_logprob"] = -0.01
    elif kind == "small_groups":  # groups of two on prompts solved about half the time: often dead by chance
        df = df[df.sample_idx < 2].copy()
        df["correct"] = df.sample_idx == (df.step % 2)  # each level solved half the time ...
        dead = df.group_id.str.endswith((":0", ":1", ":2", ":3"))
        df.loc[dead, "correct"] = df.loc[dead, "step"] % 2 == 0  # ... but half the groups all right or all wrong
        df["reward_correctness"] = df.correct.astype(float)
    elif kind == "identical_samples":  # a cold sampler: every sample of most groups the same completion
        same = ~df.group_id.str.endswith(":7")
        df.loc[same, "completion"] = "42"
    elif kind == "format_failures":
        df.loc[df.sample_idx < 4, "formatted"] = False
    elif kind == "repetition":
        df.loc[df.sample_idx < 2, "completion"] = "12121212121212"
    elif kind == "component_dominance":
        rng = np.random.default_rng(1)
        df["reward_answer_format"] = rng.random(len(df)) * 50
    elif kind == "shaped_vs_sealed":  # a bug: unparsable answers scored as correct; the sealed rate falls
        late = df.step > 6
        df.loc[late, "correct"] = df.loc[late, "sample_idx"] == 0
        df.loc[late, "reward_correctness"] = 1.0
    elif kind == "unpaid_correct":  # a parser stricter than the task: the right answers of one level go unread
        df.loc[df.correct & (df.difficulty == 2), ["reward_correctness", "reward_answer_format"]] = 0.0
    elif kind == "solve_rate_by_difficulty":
        df.loc[df.difficulty == 4, "correct"] = False
    elif kind == "update_size":  # a learning rate ten times too low: steps move the weights 1e-4 of their norm
        steps = steps_of(df)
        steps["update_ratio"] = 1.1e-4
    elif kind == "optimizer_health":
        steps = steps_of(df)
        steps.loc[5, "grad_norm"] = 20.0
    df["reward"] = df.reward_correctness + 0.1 * df.reward_answer_format if kind != "reward_spread" else df.reward
    return df, steps


CODE_ANALYZERS = {"hard_coded_outputs", "execution_errors", "tampering", "visible_hidden_divergence"}  # these read
# the code domain's execution columns: fired and not fired on crafted program rollouts in tests/test_code_domain.py
SWE_ANALYZERS = {"episode_turns", "edit_ratio", "search_before_edit", "untested_edits", "tool_errors", "echo_loops",
                 "premature_submit", "context_overflow", "leak_usage"}  # these read the swe domain's episode
# columns: fired and not fired on crafted episodes in tests/test_swe_diagnostics.py


@pytest.mark.parametrize("kind", sorted(set(REGISTRY) - CODE_ANALYZERS - SWE_ANALYZERS))
def test_each_analyzer_fires_on_its_failure(kind):
    df, steps = crafted(kind)
    assert kind in fired(df, steps)
    findings = [f for f in run_all(df, steps_of(df) if steps is None else steps) if f.analyzer == kind]
    assert all(f.message and f.severity in ("info", "warning", "critical") for f in findings)
    if kind not in ("reward_spread", "optimizer_health", "component_dominance", "update_size"):
        assert all(set(f.evidence) <= set(df.rollout_id) for f in findings)
        assert any(f.evidence for f in findings)


def _two_levels() -> pd.DataFrame:
    """Groups of 2 on two levels solved 20% and 80% of the time."""
    rows = []
    for level, rate in ((1, 0.2), (2, 0.8)):
        for g in range(50):  # a tenth of each level's samples right (or wrong) in turn: the level's rate
            for k in range(2):
                right = (2 * g + k) % 10 < rate * 10
                rows.append({"rollout_id": f"{level}:{g}:{k}", "group_id": f"{level}:{g}", "difficulty": level,
                             "correct": right, "reward": float(right)})
    return pd.DataFrame(rows)


def test_small_groups_says_the_value_it_crossed_and_what_a_larger_group_would_give():
    """Two levels solved 20% and 80% of the time in groups of 2: each group is dead by chance 0.8^2 + 0.2^2 = 68% of
    the time, the value the threshold is judged on. At the levels' mean rate (50%) it would read 50%: the message
    states the value itself (a Planner or meta-LLM reading it must not see a chance below the threshold it crossed),
    and groups of 4 at the same rates (0.8^4 + 0.2^4 = 41%), the size that would still fire."""
    [f, need] = REGISTRY["small_groups"].fn(_two_levels(), pd.DataFrame(), REGISTRY["small_groups"].defaults)
    assert f.value == pytest.approx(0.68) and f.severity == "critical"
    assert "groups of 2 are too small" in f.message and "68% of all groups are expected dead by chance" in f.message
    assert f.message.endswith("groups of 4: 41%") and "50% of all" not in f.message
    # the size that keeps it silent: these levels sit at the band's edges already, so 0.8^9 + 0.2^9 = 13.4% is both
    # the bound and today's value (0.8^8 + 0.2^8 = 16.8% is over the 15% warning)
    assert (need.metric, need.value, need.severity) == ("group_size_needed", 9, "info")
    assert "groups of 9 keep the share under the 15% warning" in need.message
    assert need.message.endswith("(at most 13%; 13% at today's rates)")
    assert f"{need.analyzer}/{need.metric}" != f"{f.analyzer}/{f.metric}"  # its own id beside the finding it sizes


def test_the_calibration_script_lists_the_size_the_group_needs_beside_the_value():
    """benchmarks/calibrate_analyzers.py forces each analyzer's thresholds to either extreme to read its metric, where
    no group size is ever named (none keeps the value under a warning of -inf; none is needed under +inf): the size
    comes from the run at the defaults, marked info, beside the value that fires."""
    spec = importlib.util.spec_from_file_location("calibrate", ROOT / "benchmarks" / "calibrate_analyzers.py")
    calibrate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(calibrate)
    rows = _two_levels()  # the levels of the test above: 68% dead by chance, 9 needed
    found = {(a, m): (v, fires) for a, m, v, _, fires in calibrate.metrics(rows, pd.DataFrame())}
    assert found[("small_groups", "expected_dead_solvable_ratio")] == (pytest.approx(0.68), "yes")
    assert found[("small_groups", "group_size_needed")] == (9, "info")


def test_small_groups_sizes_the_group_for_solve_rates_that_move_within_the_band():
    """Half the groups on a level solved 50% of the time, half on one never solved (outside the band): groups of 2
    read 0.5 x (0.5^2 + 0.5^2) = 25%, a warning. At today's rate groups of 3 would read 12.5%, but the policy's rates
    move as it trains (code/cold_pairs: groups of 4 read 14% when chosen, 22% a generation later): the size named
    keeps the value under the warning at the band's worst rate, 0.5 x (0.8^6 + 0.2^6) = 13.1% (groups of 5: 16.4%).
    With `largest` 5 no size is named (the transform then doubles); one group of all the samples is silent."""
    rows = []
    for level, right_of in ((1, lambda k: k == 0), (2, lambda k: False)):
        for g in range(100):
            for k in range(2):
                rows.append({"rollout_id": f"{level}:{g}:{k}", "group_id": f"{level}:{g}", "difficulty": level,
                             "correct": right_of(k), "reward": float(right_of(k))})
    a = REGISTRY["small_groups"]
    f, need = a.fn(pd.DataFrame(rows), pd.DataFrame(), a.defaults)
    assert (f.value, f.severity) == (pytest.approx(0.25), "warning")
    assert need.value == 6 and need.message.endswith("(at most 13%; 2% at today's rates)")
    found = a.fn(pd.DataFrame(rows), pd.DataFrame(), {**a.defaults, "largest": 5})
    assert [x.metric for x in found] == ["expected_dead_solvable_ratio"]
    big = pd.DataFrame([{**r, "group_id": f"{r['difficulty']}:all"} for r in rows])  # two groups of 200
    assert a.fn(big, pd.DataFrame(), a.defaults) == []


def test_a_step_with_every_group_dead_says_nothing_about_the_learning_rate():
    """swe/short_turns' evidence: every group dead on every step, so no step moved the weights (update ratio 0); that
    is the harness starving the gradient (`dead_groups`), not a learning rate too low, and the Planner then put a
    learning-rate raise first. Only steps with a live group are measured; with fewer than three, nothing is said."""
    df, steps = crafted("update_size")
    steps["frac_zero_std"] = 0.25
    assert "update_size" in fired(df, steps)  # the rate is too low where groups are live
    starved = steps.assign(update_ratio=0.0, frac_zero_std=1.0)
    assert "update_size" not in fired(df, starved)
    mixed = steps.assign(update_ratio=[0.0 if i % 2 else 4e-4 for i in range(len(steps))],
                         frac_zero_std=[1.0 if i % 2 else 0.5 for i in range(len(steps))])
    assert len(mixed) >= 6 and "update_size" not in fired(df, mixed)  # the live steps move 4e-4: healthy


def test_solve_rate_needs_enough_rollouts_of_a_level_to_call_it_never_solved():
    """A level never solved on 16 rollouts is not "too hard" (the curriculum would drop it): it says how many it
    needs; on 150 it is."""
    df, _ = crafted("solve_rate_by_difficulty")
    level4 = df.index[df.difficulty == 4]
    few = df.drop(level4[16:])
    [f] = [f for f in run_all(few, steps_of(few)) if f.analyzer == "solve_rate_by_difficulty"]
    assert f.severity == "info" and "too hard" not in f.message and "only 16 rollouts" in f.message
    assert "(needs 150)" in f.message
    enough = df.drop(level4[150:])
    [f] = [f for f in run_all(enough, steps_of(enough)) if f.analyzer == "solve_rate_by_difficulty"]
    assert f.severity == "warning" and "too hard" in f.message


def test_unpaid_correct_names_the_component_and_the_level_and_needs_enough_right_answers():
    df, _ = crafted("unpaid_correct")
    [f] = [f for f in run_all(df, steps_of(df)) if f.analyzer == "unpaid_correct"]
    assert f.metric == "reward_correctness_unpaid_correct" and "difficulty 2: 100%" in f.message
    assert not f.gate and set(f.evidence) <= set(df.rollout_id[df.correct & (df.difficulty == 2)])
    # every right answer unpaid, but only 19 of them: too few to judge a rate
    few = df[~df.correct | (df.index.isin(df.index[df.correct][:19]))].copy()
    few.loc[few.correct, ["reward_correctness", "reward_answer_format", "reward"]] = 0.0
    assert "unpaid_correct" not in fired(few)
    few = df[~df.correct | (df.index.isin(df.index[df.correct][:20]))].copy()
    few.loc[few.correct, ["reward_correctness", "reward_answer_format", "reward"]] = 0.0
    assert "unpaid_correct" in fired(few)


def test_divergence_is_a_gate_and_thresholds_are_overridable():
    df, _ = crafted("shaped_vs_sealed")
    gates = [f for f in run_all(df, steps_of(df)) if f.gate]
    assert gates and all(f.analyzer == "shaped_vs_sealed" and f.severity == "critical" for f in gates)
    df, _ = crafted("truncation")
    assert "truncation" not in {f.analyzer for f in run_all(df, steps_of(df), {"truncation": {"warning": 0.5,
                                                                                              "critical": 0.6}})}


def test_health_report_json_and_markdown(tmp_path):
    df, _ = crafted("shaped_vs_sealed")
    w = EvidenceWriter(tmp_path / "evidence", 0, "main")
    w.add_rollouts(df.assign(run="r", generation=0, branch="main", harness_commit="", checkpoint="c",
                             prompt_id="p", advantage=0.0).to_dict("records"))
    w.add_step({"step": 12, "reward": 0.5})
    w.flush(12)
    report = health_report(tmp_path)
    assert report.n_rollouts == len(df) and report.failed_gates == ["shaped_vs_sealed"]
    path = write_report(report, tmp_path / "reports")
    assert HealthReport.model_validate_json(path.read_text()) == report
    md = path.with_suffix(".md").read_text()
    assert "**GATE** `shaped_vs_sealed`" in md
    # a small value keeps its digits (an update ratio of 2.7e-4 once read "= 0.000 (threshold 0.0003)")
    small = report.model_copy(update={"findings": [Finding(analyzer="update_size", metric="median_update_ratio",
                                                           value=2.7e-4, threshold=3e-4, severity="warning",
                                                           message="m")]})
    assert "median_update_ratio = 0.00027 (threshold 0.0003)" in small.markdown()
