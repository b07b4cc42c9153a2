"""Reward functions of the SWE harness (TRL signature: f(prompts, completions, **columns) -> list[float]).

A completion is a whole episode: the policy's actions and the environment's observations, one action per turn
after `> `. The column `episode` (JSON, one per completion) says how it ended: `submitted`, `end` (submit,
turn_limit, context), `turns`, `tool_errors`, `edits`, and `visible_passed` of `visible_total`: the visible
tests run on the repository the episode left. The hidden tests are sealed and never reach this file.
"""

import json


def visible_tests_pass(prompts, completions, episode, **kwargs):
    """1.0 when the episode submitted and its final repository passes every visible test, else 0.0."""
    out = []
    for e in map(json.loads, episode):
        out.append(1.0 if e["submitted"] and e["visible_passed"] == e["visible_total"] else 0.0)
    return out
