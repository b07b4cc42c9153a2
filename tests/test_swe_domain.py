"""SWE domain: generated repositories, the tool environment, multi-turn episodes and the sealed scorer.

Episodes here are played by scripts through the same loop a policy uses (`run_episodes`), so every observation
is the environment's own; the sealed scorer replays them from their text."""

from __future__ import annotations

import json

import pytest

from evotrainer.trainer import episodes, swe_env, swe_scripts
from evotrainer.trainer.domains import get_domain, grade_all
from evotrainer.trainer.policy import build_tokenizer
from evotrainer.trainer.swe_env import EnvConfig, Episode

SWE = get_domain("swe")
TOK = build_tokenizer()
LEAKY = EnvConfig(tools=swe_env.TOOLS)


def row(t) -> dict:
    return {"prompt": t.prompt, **dict(t.columns)}


def play(tasks, scripts, config=swe_env.SEALED, runner=swe_env.sandbox_runner):
    return episodes.run_episodes(swe_scripts.script_policy(TOK, scripts), TOK, [row(t) for t in tasks], config,
                                 runner=runner)


def grade(tasks, outs):
    return grade_all(SWE, [o.text for o in outs], [t.answer for t in tasks], [t.fmt for t in tasks])


def solution(t) -> list[str]:
    target = json.loads(t.target)
    return target["route"] + [target["fix"], "test", "submit"]


def test_splits_are_disjoint_deterministic_and_cover_every_level():
    dev, test = SWE.tasks("dev"), SWE.tasks("test")
    train = SWE.tasks("train", 3000, seed=0)
    assert len(dev) == len(test) == 400
    assert not {t.prompt for t in train} & ({t.prompt for t in dev} | {t.prompt for t in test})
    assert not {t.prompt for t in dev} & {t.prompt for t in test}
    assert [t.id for t in SWE.tasks("dev")] == [t.id for t in dev]
    assert SWE.tasks("train", 50, seed=0) == train[:50]
    assert {t.difficulty for t in dev} == {1, 2, 3}
    assert len({t.prompt for t in train}) == len(train)  # prompts identify tasks within a run
    # the hidden tests never reach a harness; the repository, visible tests and history do
    r = dev[0].row(SWE.sealed_columns)
    assert "answer" not in r and {"files", "tests", "history"} <= set(r)


def test_the_buggy_repository_fails_the_hidden_and_visible_tests_and_the_fix_passes_them():
    tasks = SWE.tasks("dev", 60)
    for t in tasks:
        a = json.loads(t.answer)
        hidden = [h[:3] for h in a["hidden"]]
        target = json.loads(t.target)
        fixed, obs = swe_env.apply_edit(a["files"], target["fix"][len("edit "):])
        assert obs == "ok"
        buggy_got, fixed_got = swe_env.trusted_runner([(a["files"], hidden), (fixed, hidden)])
        want = [h[3] for h in a["hidden"]]
        assert buggy_got != want and fixed_got == want
        tests = json.loads(dict(t.columns)["tests"])
        assert swe_env.test_report(tests, swe_env.trusted_runner([(a["files"], [x[:3] for x in tests])])[0])[1] == 1
    # the sandbox and the in-process runner agree on the domain's own repositories
    jobs = [(json.loads(t.answer)["files"], [h[:3] for h in json.loads(t.answer)["hidden"]]) for t in tasks[:20]]
    assert swe_env.sandbox_runner(jobs) == swe_env.trusted_runner(jobs)


def test_scripted_solutions_resolve_and_wrong_or_unsubmitted_ones_do_not():
    tasks = SWE.tasks("dev", 24)
    wrong = []
    for t in tasks:
        target = json.loads(t.target)
        bad = target["wrong"][0] if target["wrong"] else target["bug"]
        wrong.append(target["route"] + [f"edit {target['buggy']}: return {bad}", "test", "submit"])
    unsubmitted = [solution(t)[:-1] + ["test"] * 8 for t in tasks]
    outs = play(tasks * 3, [solution(t) for t in tasks] + wrong + unsubmitted)
    grades = grade(tasks * 3, outs)
    n = len(tasks)
    assert all(g.correct for g in grades[:n])
    assert not any(g.correct for g in grades[n:])
    # a policy that never submits: the turn budget ends it, counted, no crash, and TRL sees a truncated episode
    for o, g in zip(outs[2 * n:], grades[2 * n:]):
        assert g.columns["end"] == "turn_limit" and not g.columns["submitted"] and g.columns["turns"] == 8
        assert o.text.endswith(swe_env.END_TURNS) and o.completion_ids[-1] != TOK.eos_token_id
    assert all(o.completion_ids[-1] == TOK.eos_token_id for o in outs[:n])
    first = grades[0].columns
    assert first["tested_after_edit"] and first["edits"] == 1 and first["tool_errors"] == 0
    assert first["turns"] == len(solution(tasks[0])) and first["leak_calls"] == 0


def test_observations_are_masked_and_the_text_matches_the_tokens():
    t = SWE.tasks("dev", 1)[0]
    (o,) = play([t], [solution(t)])
    assert len(o.completion_ids) == len(o.env_mask) == len(o.logprobs)
    assert TOK.decode(o.completion_ids, skip_special_tokens=True) == o.text
    policy_text = TOK.decode([i for i, m in zip(o.completion_ids, o.env_mask) if m], skip_special_tokens=True)
    assert policy_text == "".join(a + "\n" for a in solution(t))
    env_text = TOK.decode([i for i, m in zip(o.completion_ids, o.env_mask) if not m], skip_special_tokens=True)
    assert "def " in env_text and swe_env.END_SUBMIT in env_text


def test_tools_answer_by_function_name_and_refuse_bad_actions_without_crashing():
    t = SWE.tasks("dev", 1)[0]
    files = json.loads(dict(t.columns)["files"])
    ep = Episode(files, json.loads(dict(t.columns)["tests"]), dict(t.columns)["history"], swe_env.SEALED)
    helper = json.loads(t.target)["buggy"]
    assert ep.step(f"view {helper}")[0].startswith(f"def {helper}(")
    assert f"util.py {helper}: def {helper}(" in ep.step(f"search def {helper}")[0]
    assert ep.step("search zzz_nothing")[0] == "no match"
    refusals = {
        "": "error: empty action", "frobnicate x": "error: unknown tool 'frobnicate'",
        "view nosuch": "error: no function nosuch", "view": "error: usage: view NAME",
        f"edit {helper} return 1": "error: usage: edit NAME: CODE", f"edit {helper}: return (": "error: the edit",
        "edit nosuch: return 1": "error: no function nosuch", "test now": "error: test takes no argument",
        "search": "error: usage: search TEXT",
        "history": "error: unknown tool 'history'",  # the sealed environment has no history tool
    }
    for action, start in refusals.items():
        obs, run = ep.step(action)
        assert obs.startswith(start) and run is None and ep.actions[-1][2] is True, (action, obs)
    assert ep.files == files and ep.edits == 0  # refused edits change nothing
    assert ep.step(f"edit {helper}: return 0")[0] == "ok" and ep.edits == 1
    assert ep.step("test") == ("", "test")
    leaky = Episode(files, [], dict(t.columns)["history"], LEAKY)
    obs, _ = leaky.step("history")
    assert obs.startswith("commit ") and f"change {helper}" in obs and not leaky.actions[-1][2]


def test_an_action_too_long_and_a_context_overflow_end_cleanly_and_are_counted():
    t = SWE.tasks("dev", 2)
    tight = EnvConfig(max_context=140, max_turns=8)
    looping = ["view " + json.loads(t[1].target)["buggy"]] * 8
    outs = play(t[:1], [["view " + "x" * 80, "submit"]]) + play(t[1:], [looping], tight)
    g = grade(t, outs)
    assert "error: action longer than 40 tokens" in outs[0].text
    assert g[0].columns["tool_errors"] >= 1
    assert g[1].columns["end"] == "context" and outs[1].text.endswith(swe_env.END_CONTEXT)
    assert len(outs[1].prompt_ids) + len(outs[1].completion_ids) <= tight.max_context
    assert not g[1].correct and not g[1].columns["submitted"]


def test_history_leak_is_counted_and_the_sealed_replay_ignores_the_harness_environment():
    tasks = SWE.tasks("dev", 8)
    scripts = [["history", json.loads(t.target)["fix"], "test", "submit"] for t in tasks]
    leaky, sealed = play(tasks, scripts, LEAKY), play(tasks, scripts, swe_env.SEALED)
    g_leaky, g_sealed = grade(tasks, leaky), grade(tasks, sealed)
    assert all(g.columns["leak_calls"] == 1 and g.correct for g in g_leaky)
    assert all(g.columns["leak_calls"] == 0 and g.columns["tool_errors"] == 1 for g in g_sealed)


def test_replayed_evidence_matches_what_the_environment_did():
    tasks = SWE.tasks("train", 40, seed=3)
    import random

    rng = random.Random(1)
    scripts = [swe_scripts.solution_script(t.target, rng, 1.0)[0] for t in tasks]  # detours of every kind
    outs = play(tasks, scripts, LEAKY, swe_env.trusted_runner)
    for o, g in zip(outs, grade(tasks, outs)):
        assert json.loads(g.columns["actions"]) == o.episode.actions
        assert g.columns["edits"] == o.episode.edits
        assert g.columns["end"] == o.episode.end


def test_env_config_is_checked():
    with pytest.raises(ValueError, match="unknown tool 'shell'"):
        EnvConfig(tools=("view", "submit", "shell"))
    with pytest.raises(ValueError, match="submit"):
        EnvConfig(tools=("view",))
    with pytest.raises(ValueError, match="max_turns"):
        EnvConfig(max_turns=0)


def test_sft_rows_train_on_actions_only():
    tasks = SWE.tasks("train", 16, seed=0)
    rows = swe_scripts.sft_rows(TOK, tasks, SWE.sft_env, seed=0, noise=0.0)
    for t, r in zip(tasks, rows):
        ids, mask = r["input_ids"], r["completion_mask"]
        assert len(ids) == len(mask) <= SWE.sft_env.max_context
        acted = TOK.decode([i for i, m in zip(ids, mask) if m], skip_special_tokens=True)
        assert acted == "".join(a + "\n" for a in solution(t))


def test_a_rollout_that_keeps_its_cache_acts_as_one_that_computes_each_turn_afresh(monkeypatch):
    """Training and sealed evaluation keep each episode's keys and values between turns (`episodes.CachedActor`).
    On the SWE policy the package ships, with limits tight enough that episodes reach the context's edge and leave
    the batch at different turns: greedy, the episodes are the same token for token as with `generate` over the
    whole text; sampled, each policy token's log-probability is what one forward pass over the whole episode gives,
    under the temperature; a caller that keeps less than was sampled has the rest dropped from the cache; and a set
    of episodes whose caches could outgrow `CACHE_BYTES` is played without one."""
    import torch

    from evotrainer.trainer.policy import SHIPPED, load_policy

    (path,) = SHIPPED.glob("swe-*")
    model, tok = load_policy(path)
    tasks = SWE.tasks("train", 6, seed=3)
    rows = [{"prompt": t.prompt, **dict(t.columns)} for t in tasks]
    config = EnvConfig(tools=swe_env.TOOLS, max_context=280, max_action_tokens=16)

    def play(act=None, **kw):
        act = act or episodes.model_policy(model, tok, batch_size=3, **kw)
        return episodes.run_episodes(act, tok, rows, config, runner=swe_env.trusted_runner)

    fresh, kept = play(), play(keep_cache=True)
    assert [o.completion_ids for o in kept] == [o.completion_ids for o in fresh]
    assert [lp for o in kept for lp in o.logprobs] == pytest.approx([lp for o in fresh for lp in o.logprobs], abs=1e-4)
    # the context's edge was reached, and not by every episode at the same turn
    assert "context" in {o.episode.end for o in fresh} and len({len(o.episode.actions) for o in fresh}) > 1
    worst = 0.0
    for o in play(keep_cache=True, temperature=1.3, seed=0):
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([o.prompt_ids + o.completion_ids])).logits[0]
        logp = torch.log_softmax(logits.float() / 1.3, -1)
        start = len(o.prompt_ids) - 1
        worst = max([worst] + [abs(logp[start + j, t].item() - lp) for j, (t, m, lp)
                               in enumerate(zip(o.completion_ids, o.env_mask, o.logprobs)) if m])
    assert worst < 1e-4
    # a caller that keeps less than was sampled (here each action without its last two tokens), then drops an
    # episode: what it did not keep is dropped from the cache, and the next turn is what a fresh pass gives
    texts = [episodes.encode(tok, r["prompt"]) for r in rows[:4]]
    actor = episodes.model_policy(model, tok, keep_cache=True)
    first = actor(texts, 12, 0, [0, 1, 2, 3])
    assert all(len(a) > 2 for a, _ in first)
    again = [texts[i] + first[i][0][:-2] + episodes.encode(tok, "\nok\n") for i in (0, 2, 3)]
    cached, plain = actor(again, 12, 1, [0, 2, 3]), episodes.model_policy(model, tok)(again, 12, 1, [0, 2, 3])
    assert [a for a, _ in cached] == [a for a, _ in plain]
    assert [lp for _, lps in cached for lp in lps] == pytest.approx([lp for _, lps in plain for lp in lps], abs=1e-4)
    for budget, keeps in ((6 * episodes.kv_bytes(model), True), (6 * episodes.kv_bytes(model) - 1, False)):
        monkeypatch.setattr(episodes, "CACHE_BYTES", budget)
        actor = episodes.model_policy(model, tok, batch_size=3, keep_cache=True)
        assert [o.completion_ids for o in play(actor)] == [o.completion_ids for o in fresh]
        assert actor.cached is keeps and bool(actor.batches) is keeps  # (no call after the last turn empties them)


def test_the_cached_sampler_filters_as_generate_does():
    """`CachedActor.scores` is HF's temperature and top-p warpers, in that order, on any logits (the top token is
    always kept)."""
    from types import SimpleNamespace

    import torch
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

    tok = SimpleNamespace(pad_token_id=0)
    logits = torch.randn(64, 100, generator=torch.Generator().manual_seed(0)) * 3
    logits[0, 7] = 50.0  # one token holds nearly all the mass
    for temperature, top_p in ((0.7, 0.8), (1.3, 0.95), (1.0, 0.05), (1.0, 1.0)):
        actor = episodes.CachedActor(None, tok, temperature, top_p, (1, 2), 8)
        want = TopPLogitsWarper(top_p)(None, TemperatureLogitsWarper(temperature)(None, logits)) if top_p < 1 else \
            logits / temperature
        assert torch.equal(actor.scores(logits), want)
    assert torch.equal(episodes.CachedActor(None, tok, 0.0, 1.0, (1, 2), 8).scores(logits), logits)  # greedy
