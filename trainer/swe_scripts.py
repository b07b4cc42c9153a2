"""What SWE training adds to the episode loop (`episodes.py`): scripted episodes, played by fixed action lists, for
the warm-up's SFT rows and for the reward check of a harness, and the `episode` column reward functions receive.

Nothing here is played by sealed evaluation, so none of it is part of the SWE scorer's fingerprint; the scripted
episodes of the warm-up are part of the swe warm policy's cache key instead (`policy.cache_key`).
"""

from __future__ import annotations

import json

from evotrainer.trainer import swe_env
from evotrainer.trainer.episodes import Rollout, encode, run_episodes
from evotrainer.trainer.swe_env import EnvConfig


def script_policy(tokenizer, scripts: list[list[str]]):
    """The acting function that plays fixed action lists (the SFT warm-up's solution episodes)."""
    def act(contexts: list[list[int]], max_new: int, turn: int, which: list[int]):
        return [(encode(tokenizer, scripts[i][turn] + "\n") if turn < len(scripts[i]) else
                 encode(tokenizer, "submit\n"), None) for i in which]
    return act


# Detours of the scripted SFT episodes and their shares. A look at the version history is the most common: many
# real agents run `git log -p` first, and it is what makes the template's history tool a leak RL can find. Some
# look where the tool does not exist (the sealed environment): the error comes back and the episode goes on.
DETOURS = {"history": 0.6, "history_refused": 0.15, "wrong_fix": 0.08, "search": 0.07, "no_test": 0.05,
           "typo": 0.05}


def solution_script(target: str, rng, noise: float) -> tuple[list[str], bool]:
    """The actions of a scripted solution episode (a task's `target`), with the detours of a fallible engineer in a
    share `noise` of them: a wrong first fix caught by the tests, a search instead of a view, no test before the
    submit, a typo'd action, or a look at the version history (whose last commit shows the fix). The flag says the
    episode is played without the history tool (its call is refused)."""
    t = json.loads(target)
    route, fix, buggy = list(t["route"]), t["fix"], t["buggy"]
    tail = [fix, "test", "submit"]
    if rng.random() >= noise:
        return route + tail, False
    kind = rng.choices(*zip(*DETOURS.items()))[0]
    if kind == "history":  # copies the fix from the commit that introduced the bug: the leak RL may amplify
        return ["history", *tail], False
    if kind == "history_refused":
        return ["history", *route, *tail], True
    if kind == "wrong_fix":
        wrong = t["wrong"][0] if t["wrong"] else t["bug"]
        return route + [f"edit {buggy}: return {wrong}", "test", *tail], False
    if kind == "search" and route[0].startswith("view "):
        return ([f"search {route[0][5:]}", *route[1:], *tail] if len(route) > 1 else [f"search {buggy}", *tail]), False
    if kind == "no_test":
        return route + [fix, "submit"], False
    i = rng.randrange(len(route))
    typo = route[i][:-1] + rng.choice("xqz_") if len(route[i]) > 5 else route[i] + "x"
    return route[:i] + [typo] + route[i:] + tail, False


def sft_rows(tokenizer, tasks: list, config: EnvConfig, seed: int, noise: float) -> list[dict]:
    """Tokenised SFT rows of scripted episodes: `input_ids` (prompt and episode) and `completion_mask`, 1 on the
    policy's actions only, so the warm-up never learns to write observations. Played in `config`, except those
    whose history call is refused (played without that tool). Test runs happen in-process: the repositories and
    the scripted edits are the domain's own code."""
    import random

    rng = random.Random(f"swe-sft-{seed}")
    scripted = [solution_script(t.target, rng, noise) for t in tasks]
    refused_config = EnvConfig(tools=tuple(x for x in config.tools if x != "history"), max_turns=config.max_turns,
                               max_context=config.max_context, max_action_tokens=config.max_action_tokens)
    out: list[dict | None] = [None] * len(tasks)
    for refused, cfg in ((False, config), (True, refused_config)):
        idx = [i for i, (_, r) in enumerate(scripted) if r == refused]
        rows = [{"prompt": tasks[i].prompt, **dict(tasks[i].columns)} for i in idx]
        outs = run_episodes(script_policy(tokenizer, [scripted[i][0] for i in idx]), tokenizer, rows, cfg,
                            runner=swe_env.trusted_runner)
        for i, o in zip(idx, outs):
            out[i] = {"input_ids": o.prompt_ids + o.completion_ids,
                      "completion_mask": [0] * len(o.prompt_ids) + o.env_mask}
    return out


def episode_info(rollouts: list[Rollout], runner=swe_env.sandbox_runner) -> list[str]:
    """The `episode` column reward functions receive (JSON): how the episode ended, its turns and tool errors,
    and the visible tests on the repository it left (`visible_passed` of `visible_total`). Nothing hidden."""
    got = runner([(o.episode.files, [t[:3] for t in o.episode.tests]) for o in rollouts])
    out = []
    for o, g in zip(rollouts, got):
        e = o.episode
        passed = sum(x == t[3] for x, t in zip(g, e.tests))
        out.append(json.dumps({"submitted": e.end == "submit", "end": e.end or "turn_limit", "turns": len(e.actions),
                               "tool_errors": sum(bool(a[2]) for a in e.actions), "edits": e.edits,
                               "visible_passed": passed, "visible_total": len(e.tests)}))
    return out


def sample_episodes(domain, tasks: list) -> dict:
    """A reward-check batch of scripted episodes: solved, wrongly fixed, submitted at once, garbled."""
    from evotrainer.trainer.policy import build_tokenizer

    tokenizer = build_tokenizer()
    rows, scripts = [], []
    for t in tasks:
        target = json.loads(t.target)
        wrong = f"edit {target['buggy']}: return {target['wrong'][0] if target['wrong'] else target['bug']}"
        for script in (target["route"] + [target["fix"], "test", "submit"], [wrong, "submit"], ["submit"],
                       ["???", "view", "edit x", "submit"]):
            rows.append({"prompt": t.prompt, **dict(t.columns)})
            scripts.append(script)
    outs = run_episodes(script_policy(tokenizer, scripts), tokenizer, rows, domain.sft_env,
                        runner=swe_env.trusted_runner)
    sealed = getattr(domain, "sealed_columns", ())
    task_rows = [t.row(sealed) for t in tasks for _ in range(4)]
    batch = {k: [r[k] for r in task_rows] for k in task_rows[0]}
    batch["completions"] = [o.text for o in outs]
    batch["episode"] = episode_info(outs, swe_env.trusted_runner)
    return batch
