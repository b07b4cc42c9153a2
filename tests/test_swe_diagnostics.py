"""The swe domain's analyzers fire on crafted episodes that show their failure, stay silent on scripted good
episodes (view, edit, test, submit), and report nothing on evidence without the swe columns."""

import json

import pandas as pd
import pytest

from evotrainer.trainer.diagnostics import REGISTRY, run_all

SWE = ["episode_turns", "edit_ratio", "search_before_edit", "untested_edits", "tool_errors", "echo_loops",
       "premature_submit", "context_overflow", "leak_usage"]
SEALED = ("search", "view", "edit", "test", "submit")

GOOD = [("view", "cost", False), ("view", "mul", False), ("edit", "mul: return a * b", False), ("test", "", False),
        ("submit", "", False)]
SEARCHED = [("search", "mul", False), ("view", "mul", False), ("edit", "mul: return a * b", False),
            ("test", "", False), ("submit", "", False)]
WANDER = [("view", "cost", False), ("view", "mul", False), ("view", "area", False), ("view", "inc", False),
          ("edit", "mul: return a * b", False), ("test", "", False), ("submit", "", False)]  # no loop: args differ
ABANDON = [("submit", "", False)]
READ_ONLY = [("view", "cost", False), ("view", "mul", False), ("test", "", False), ("submit", "", False)]
SLOW = [("view", "cost", False)] + [("search", f"x{i}", False) for i in range(6)] + GOOD[2:]
BLIND = [("edit", "mul: return a * b", False), ("test", "", False), ("submit", "", False)]
UNTESTED = [("view", "mul", False), ("edit", "mul: return a * b", False), ("submit", "", False)]
ERRORS = [("view", "mul", False), ("?", "fix it", True), ("edit", "mul: return a *", True),
          ("edit", "mul: return a * b", False), ("test", "", False), ("submit", "", False)]
LOOP = [("view", "mul", False)] * 3 + GOOD[2:]
OVERFLOW = [("search", "a", False), ("view", "cost", False), ("view", "mul", False)]
NEVER_DONE = [("view", "cost", False), ("view", "mul", False), ("edit", "mul: return a - b", False),
              ("test", "", False)] * 2
LEAK = [("history", "", False), ("edit", "mul: return a * b", False), ("test", "", False), ("submit", "", False)]


def episode(actions: list[tuple[str, str, bool]], end: str | None = None, correct: bool | None = None) -> dict:
    """The evidence columns of one episode, derived from its actions the way the sealed scorer derives them."""
    last_edit = max((i for i, (tool, _, err) in enumerate(actions) if tool == "edit" and not err), default=-1)
    last_test = max((i for i, (tool, _, err) in enumerate(actions) if tool == "test" and not err), default=-1)
    if end is None:
        end = "submit" if actions and actions[-1][0] == "submit" and not actions[-1][2] else "turn_limit"
    tested = last_edit >= 0 and last_test > last_edit
    return dict(turns=len(actions), tool_calls=sum(tool != "?" for tool, _, _ in actions),
                tool_errors=sum(err for _, _, err in actions), actions=json.dumps([list(a) for a in actions]),
                edits=sum(tool == "edit" and not err for tool, _, err in actions), submitted=end == "submit",
                end=end, tested_after_edit=tested,
                leak_calls=sum(tool not in SEALED and tool != "?" and not err for tool, _, err in actions),
                transcript="\n> ".join(f"{tool} {arg}".strip() for tool, arg, _ in actions),
                correct=(end == "submit" and tested) if correct is None else correct)


def episodes(specs: list) -> pd.DataFrame:
    """A batch of episodes: each spec is a list of actions, or (actions, end, correct) with None for derived."""
    rows = []
    for i, spec in enumerate(specs):
        ep = episode(spec) if isinstance(spec, list) else episode(*spec)
        rows.append(dict(rollout_id=f"r/{i}", step=1 + i // 16, group_id=f"{1 + i // 16}:{i // 4}",
                         prompt_id=f"p{i // 4}", sample_idx=i % 4, completion=ep["transcript"],
                         reward=float(ep["correct"]), truncated=False, **ep))
    return pd.DataFrame(rows)


def healthy(n: int = 20) -> pd.DataFrame:
    return episodes([(GOOD, SEARCHED, WANDER)[i % 3] for i in range(n)])


def mixed(bad: list, k: int, n: int = 20) -> pd.DataFrame:
    """k bad episodes among n, the rest healthy."""
    return episodes([bad] * k + [(GOOD, SEARCHED)[i % 2] for i in range(n - k)])


def steps_of(df: pd.DataFrame) -> pd.DataFrame:
    s = df.groupby("step").agg(reward=("reward", "mean")).reset_index()
    s["grad_norm"], s["kl"], s["clip_ratio"] = 0.1, 0.0, 0.0
    return s


def findings(kind: str, df: pd.DataFrame) -> list:
    return [f for f in REGISTRY[kind].run(df, steps_of(df)) if f.severity != "info"]


CASES = [  # (analyzer, batch, metric, severity)
    ("episode_turns", lambda: mixed(ABANDON, 6), "short_episode_ratio", "warning"),
    ("episode_turns", lambda: mixed(ABANDON, 10), "short_episode_ratio", "critical"),
    ("edit_ratio", lambda: mixed(READ_ONLY, 12), "no_edit_ratio", "warning"),
    ("edit_ratio", lambda: mixed(READ_ONLY, 18), "no_edit_ratio", "critical"),
    ("edit_ratio", lambda: episodes([SLOW] * 20), "edits_per_turn", "warning"),
    ("search_before_edit", lambda: mixed(BLIND, 8), "blind_edit_ratio", "warning"),
    ("search_before_edit", lambda: mixed(BLIND, 14), "blind_edit_ratio", "critical"),
    ("untested_edits", lambda: mixed(UNTESTED, 8), "untested_edit_ratio", "warning"),
    ("untested_edits", lambda: mixed(UNTESTED, 14), "untested_edit_ratio", "critical"),
    ("tool_errors", lambda: mixed(ERRORS, 10), "tool_error_rate", "warning"),
    ("tool_errors", lambda: mixed(ERRORS, 20), "tool_error_rate", "critical"),
    ("echo_loops", lambda: mixed(LOOP, 2), "echo_loop_ratio", "warning"),
    ("echo_loops", lambda: mixed(LOOP, 6), "echo_loop_ratio", "critical"),
    ("premature_submit", lambda: mixed(UNTESTED, 6), "premature_submit_ratio", "warning"),
    ("premature_submit", lambda: mixed(ABANDON, 10), "premature_submit_ratio", "critical"),
    ("context_overflow", lambda: mixed((OVERFLOW, "context", False), 2), "context_overflow_ratio", "warning"),
    ("context_overflow", lambda: mixed((OVERFLOW, "context", False), 4), "context_overflow_ratio", "critical"),
    ("context_overflow", lambda: mixed(NEVER_DONE, 2), "turn_limit_ratio", "warning"),
    ("context_overflow", lambda: mixed(NEVER_DONE, 4), "turn_limit_ratio", "critical"),
    ("leak_usage", lambda: mixed(LEAK, 1, n=30), "leak_usage_ratio", "warning"),
    ("leak_usage", lambda: mixed(LEAK, 4), "leak_usage_ratio", "critical"),
]


@pytest.mark.parametrize(("kind", "batch", "metric", "severity"), CASES,
                         ids=[f"{c[0]}-{c[2]}-{c[3]}" for c in CASES])
def test_each_analyzer_fires_at_its_severity(kind, batch, metric, severity):
    df = batch()
    found = {f.metric: f for f in findings(kind, df)}
    assert metric in found, found
    f = found[metric]
    assert f.severity == severity and f.threshold is not None and f.message
    assert f.evidence and set(f.evidence) <= set(df.rollout_id)


@pytest.mark.parametrize("kind", SWE)
def test_each_analyzer_is_silent_on_good_episodes(kind):
    assert kind in REGISTRY and REGISTRY[kind].doc
    df = healthy()
    assert findings(kind, df) == []
    assert all(not f.gate for f in REGISTRY[kind].run(df, steps_of(df)))


def test_mean_turns_is_reported_as_info():
    df = healthy()
    (info,) = REGISTRY["episode_turns"].run(df, steps_of(df))
    assert info.metric == "mean_turns" and info.severity == "info"
    assert info.value == pytest.approx(df.turns.mean())
    assert info.evidence and set(info.evidence) <= set(df.rollout_id)


def test_loop_needs_the_same_argument_and_consecutive_repeats():
    spread = [("view", "mul", False), ("view", "cost", False), ("view", "mul", False), ("view", "cost", False)]
    twice = [("view", "mul", False)] * 2 + [("test", "", False)] + [("view", "mul", False)] * 2
    assert findings("echo_loops", mixed(spread + GOOD[2:], 10)) == []
    assert findings("echo_loops", mixed(twice + GOOD[2:], 10)) == []
    assert REGISTRY["echo_loops"].run(mixed(twice + GOOD[2:], 10), None, {"repeat": 2})


def test_blind_edit_counts_only_looks_that_worked():
    failed_look = [("view", "nosuch", True)] + BLIND
    (f,) = findings("search_before_edit", mixed(failed_look, 14))
    assert f.severity == "critical"


def test_tool_error_breakdown_names_the_tools():
    (f,) = findings("tool_errors", mixed(ERRORS, 20))
    assert "edit 50%" in f.message and "? 50%" in f.message


def test_premature_submit_splits_no_edit_and_untested():
    (f,) = findings("premature_submit", episodes([ABANDON] * 5 + [UNTESTED] * 5 + [GOOD] * 10))
    assert f.value == pytest.approx(0.5) and "25% with no edit" in f.message and "25% with an edit" in f.message


def test_leak_usage_is_a_gate():
    df = mixed(LEAK, 4)
    fs = findings("leak_usage", df)
    assert fs and all(f.gate and f.severity == "critical" for f in fs)
    assert {f.metric for f in fs} == {"leak_usage_ratio", "resolved_with_leak_ratio"}
    assert all("env.py" in f.message and "TOOLS" in f.message and "history" in f.message for f in fs)
    assert all(f.evidence and set(f.evidence) <= set(df.rollout_id) for f in fs)
    # low usage is only a warning ...
    (warn,) = findings("leak_usage", mixed(LEAK, 1, n=30))
    assert warn.severity == "warning" and not warn.gate
    # ... unless the resolved episodes depend on it: 2 of 10 resolved episodes used the leak
    wrong = [("view", "mul", False), ("edit", "mul: return a - b", False), ("test", "", False), ("submit", "", False)]
    df = episodes([LEAK] * 2 + [GOOD] * 8 + [(wrong, None, False)] * 30)
    gates = [f for f in findings("leak_usage", df) if f.gate]
    assert [f.metric for f in gates] == ["resolved_with_leak_ratio"] and gates[0].value == pytest.approx(0.2)
    assert set(gates[0].evidence) == {"r/0", "r/1"}
    # a leak tool called while disabled (an error observation) is no leak
    disabled = [("history", "", True)] + GOOD
    assert findings("leak_usage", mixed(disabled, 10)) == []


def test_thresholds_are_overridable():
    df = mixed(BLIND, 8)
    assert REGISTRY["search_before_edit"].run(df, steps_of(df), {"warning": 0.5, "critical": 0.9}) == []


def test_silent_on_evidence_without_swe_columns():
    math = pd.DataFrame([dict(rollout_id=f"r/{i}", step=1, group_id=f"1:{i // 4}", prompt_id=f"p{i // 4}",
                              sample_idx=i % 4, difficulty=1, completion="42", correct=i % 2 == 0,
                              reward=float(i % 2 == 0), truncated=False, loss_masked=False, n_tokens=3,
                              formatted=True, mean_logprob=-0.5) for i in range(16)])
    assert run_all(math, steps_of(math), only=SWE) == []
    for kind in SWE:
        assert REGISTRY[kind].run(math, steps_of(math)) == []


def test_mixed_evidence_reads_only_swe_rows():
    """A slice holding math rows too (NaN in the swe columns) is read over its episodes only."""
    swe = mixed(BLIND, 14)
    math = pd.DataFrame([dict(rollout_id=f"m/{i}", step=1, group_id="m", prompt_id="m", completion="42",
                              correct=True, reward=1.0, truncated=False) for i in range(20)])
    df = pd.concat([math, swe], ignore_index=True)
    (f,) = findings("search_before_edit", df)
    assert f.value == pytest.approx(0.7) and set(f.evidence) <= set(swe.rollout_id)


def test_premature_submit_names_the_component_that_pays_for_it_and_the_planner_removes_it():
    """A component that pays every submit gives untested submits what it gives tested ones: named, and the offline
    Planner's first proposal removes exactly it; a component that needs a passing test is never named."""
    from evotrainer.agents.offline.catalog import apply
    from evotrainer.agents.offline.edits import add_reward
    from evotrainer.agents.offline.policy import OfflinePolicy
    from evotrainer.agents.schemas import Diagnosis, PlanInput
    from evotrainer.workspaces import TEMPLATES

    df = episodes([ABANDON] * 5 + [UNTESTED] * 5 + [GOOD] * 10)
    df["reward_submit_bonus"] = df["submitted"].astype(float) * 0.5
    df["reward_visible_tests_pass"] = df["correct"].astype(float)
    fs = findings("premature_submit", df)
    assert [f.metric for f in fs] == ["premature_submit_ratio", "reward_submit_bonus_pays_premature_submit"]
    assert fs[1].value == pytest.approx(0.5) and fs[1].threshold == pytest.approx(0.5)
    assert set(fs[1].evidence) == set(fs[0].evidence)
    only_fixes = findings("premature_submit", df.drop(columns="reward_submit_bonus"))
    assert [f.metric for f in only_fixes] == ["premature_submit_ratio"]

    files = {p: (TEMPLATES / "swe" / p).read_text() for p in ("harness.yaml", "rewards.py", "filters.py", "env.py")}
    files["harness.yaml"] = add_reward(files["harness.yaml"], "submit_bonus", 0.5, "pays every submit")
    files["rewards.py"] += ("\n\ndef submit_bonus(prompts, completions, **kwargs):\n"
                            "    return [0.5 for _ in completions]\n")
    change = apply("remove_component", files, fs)
    assert change is not None and change.change == "remove the reward component submit_bonus"
    assert "submit_bonus" not in change.files["harness.yaml"] and "visible_tests_pass" in change.files["harness.yaml"]
    assert apply("remove_component", files, only_fixes) is None
    plan = OfflinePolicy().plan(PlanInput(generation=1, domain="swe", k=3, findings=fs, files=files,
                                          diagnosis=Diagnosis(generation=1, summary=fs[0].message)))
    assert plan.interventions[0].transform == "remove_component"
