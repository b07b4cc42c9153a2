"""The offline meta-policy's intervention catalog: real, single-factor transforms of harness files.

Each transform reads the champion's files and the findings of its health report and either returns one
`Change` (the edited files, the change in words, a falsifiable hypothesis, the expected effect) or None
when its precondition does not hold (nothing it would fix, or the harness already has it). `relevance`
says which analyzers call for it; the policy ranks transforms by the findings that fired and by skill
memory (`agents/offline/policy.py`).

Transforms of kind "diagnostics" change what the harness measures, not how it trains: they are not
proposed as candidates (a short run cannot show a dev gain for them) but applied by diagnostics revision.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import yaml

from evotrainer.agents.offline.edits import (
    EditError,
    add_reward,
    remove_reward,
    rename_reward,
    set_knob,
    set_list,
    set_reward_weight,
    set_threshold,
)
from evotrainer.agents.schemas import ExpectedEffect
from evotrainer.trainer.diagnostics import REGISTRY, Finding
from evotrainer.trainer.harness import TRAINER_DEFAULTS

Files = dict[str, str]  # path in the harness -> text


@dataclass
class Change:
    files: Files
    change: str
    hypothesis: str
    expected: ExpectedEffect = field(default_factory=ExpectedEffect)


@dataclass(frozen=True)
class Transform:
    id: str
    factor: str
    kind: str  # reward / filters / recipe / diagnostics
    summary: str
    relevance: dict[str, float]  # analyzer id -> how strongly its findings call for this transform
    # > 0: proposed with no finding calling for it, as exploration of the recipe; larger first when memory knows
    # nothing of either (the order the literature and the templates' own tuning suggest, see CATALOG)
    explore: float
    make: Callable[[Files, list[Finding]], Change | None]
    sets: tuple[str, ...] = ()  # the `trainer.<key>`s a recipe transform of several keys sets (one key: its factor)

    @property
    def knobs(self) -> tuple[str, ...]:
        """The `trainer.<key>`s this transform sets: exploration does not undo what a promotion set (policy.py)."""
        return self.sets or ((self.factor.split(".", 1)[1],) if self.kind == "recipe" else ())


def _spec(files: Files) -> dict:
    return yaml.safe_load(files["harness.yaml"]) or {}


def _knob(files: Files, key: str, trl_default=None):
    """The harness's `trainer.<key>`, else what training uses without it: the backend's default (TRAINER_DEFAULTS),
    else TRL's (`trl_default`). A null is TRL's "unset" (epsilon_high: as epsilon), read as absent."""
    value = (_spec(files).get("trainer") or {}).get(key)
    return TRAINER_DEFAULTS.get(key, trl_default) if value is None else value


def _fired(findings: list[Finding], analyzer_id: str) -> list[Finding]:
    return [f for f in findings if f.analyzer == analyzer_id and f.severity != "info"]


def _multi_turn(files: Files) -> bool:
    """An episode harness (env.py): its length is bounded by the environment's turns and context, and a
    "truncated" episode is one that never submitted, so the completion-length transforms do not apply."""
    return "env.py" in files


def _append_function(source: str, name: str, code: str) -> str:
    if re.search(rf"^def {re.escape(name)}\(", source, flags=re.M):
        return source
    return source.rstrip("\n") + "\n\n\n" + code.strip("\n") + "\n"


def _knob_change(files: Files, key: str, value, change: str, hypothesis: str, metric: str = "dev_accuracy"
                 ) -> Change:
    return Change({"harness.yaml": set_knob(files["harness.yaml"], key, value, comment=change)}, change, hypothesis,
                  ExpectedEffect(metric=metric, direction="up", size=0.01))


# -- filters -------------------------------------------------------------------------------------------
DROP_DEAD = '''
def drop_dead_groups(group):
    """Keep a group only when its rewards differ: a zero-variance group has zero advantage."""
    rewards = [r["reward"] for r in group]
    return max(rewards) - min(rewards) > 1e-6
'''


def drop_dead_groups(files: Files, findings: list[Finding]) -> Change | None:
    spec = _spec(files)
    current = list(spec.get("group_filters") or [])
    if "drop_dead_groups" in current:
        return None
    dead = _fired(findings, "dead_groups")
    ratio = f"{dead[0].value:.0%} of groups are dead" if dead else "dead groups dilute the loss"
    return Change(
        {"harness.yaml": set_list(files["harness.yaml"], "group_filters", [*current, "drop_dead_groups"]),
         "filters.py": _append_function(files.get("filters.py", ""), "drop_dead_groups", DROP_DEAD)},
        "take zero-variance groups out of the loss (group filter drop_dead_groups)",
        f"If we drop zero-variance groups from each step, dev accuracy improves because {ratio} and under a "
        "token-level loss they only dilute the gradient of the groups that carry signal.")


def curriculum_drop_unsolved(files: Files, findings: list[Finding]) -> Change | None:
    hard = [f for f in findings if f.analyzer == "solve_rate_by_difficulty" and "too hard" in f.message]
    if not hard:
        return None
    levels = sorted({int(f.metric.rsplit("_d", 1)[1]) for f in hard if re.search(r"_d\d+$", f.metric)})
    if not levels:
        return None
    name = "drop_unsolved_levels_" + "_".join(map(str, levels))
    current = list(_spec(files).get("filters") or [])
    if name in current:
        return None
    code = (f"def {name}(rows):\n"
            f"    \"\"\"Curriculum: leave out difficulty levels {levels}, never solved yet (all-failed groups\n"
            f"    teach nothing). When that would leave nothing to train on, keep every row.\"\"\"\n"
            f"    kept = [r for r in rows if r[\"difficulty\"] not in {set(levels)!r}]\n"
            f"    return kept or rows\n")
    return Change(
        {"harness.yaml": set_list(files["harness.yaml"], "filters", [*current, name]),
         "filters.py": _append_function(files.get("filters.py", ""), name, code)},
        f"curriculum: train without difficulty levels {levels} (solve rate near zero)",
        f"If we leave out levels {levels} for now, dev accuracy improves because their groups are all-failed "
        "(zero advantage) and the freed batch goes to levels with signal.")


# -- rewards -------------------------------------------------------------------------------------------
def format_weight(files: Files, findings: list[Finding]) -> Change | None:
    rewards = {r["name"]: r.get("weight", 1.0) for r in _spec(files).get("rewards", [])}
    name = next((n for n in rewards if n.endswith("_format")), None)  # answer_format (math), expression_format (code)
    if name is None or rewards[name] >= 0.5 or not _fired(findings, "format_failures"):
        return None
    new = round(min(0.5, max(0.3, rewards[name] * 3)), 3)
    return Change({"harness.yaml": set_reward_weight(files["harness.yaml"], name, new)},
                  f"raise the {name} reward weight {rewards[name]:g} -> {new:g}",
                  "If we pay more for a readable final answer, the format failure rate falls and dev accuracy "
                  "rises because unreadable answers are graded wrong whatever they compute.",
                  ExpectedEffect(metric="dev_accuracy", direction="up", size=0.01))


NEAR_MISS = '''
def near_miss(prompts, completions, answer, fmt, **kwargs):
    """Guarded partial credit: a parsable final answer close to the expected one earns up to 0.5; an empty,
    unparsable or far-off answer earns nothing, so the reward never pays for not answering."""
    out = []
    for completion, expected, f in zip(completions, answer, fmt):
        value = final_answer(completion, f)
        if value is None:
            out.append(0.0)
            continue
        target = int(expected)
        out.append(0.5 * max(0.0, 1.0 - abs(value - target) / max(abs(target), 1)))
    return out
'''


def partial_credit(files: Files, findings: list[Finding]) -> Change | None:
    names = [r["name"] for r in _spec(files).get("rewards", [])]
    if "near_miss" in names or "def final_answer(" not in files.get("rewards.py", ""):
        return None
    return Change({"harness.yaml": add_reward(files["harness.yaml"], "near_miss", 0.2, "guarded partial credit"),
                   "rewards.py": _append_function(files["rewards.py"], "near_miss", NEAR_MISS)},
                  "add a guarded partial-credit reward near_miss (weight 0.2)",
                  "If near misses earn partial credit, dev accuracy improves because groups where every answer is "
                  "wrong get reward variance (a direction toward the answer) instead of zero advantage.")


def _culprit_components(findings: list[Finding]) -> list[str]:
    out = []
    for f in findings:
        m = re.match(r"reward_(\w+?)_(variance_share|rise_while_correct_flat|pays_premature_submit)$", f.metric)
        if f.analyzer in ("component_dominance", "shaped_vs_sealed", "premature_submit") and m:
            out.append(m.group(1))
    return out


def remove_component(files: Files, findings: list[Finding]) -> Change | None:
    names = [r["name"] for r in _spec(files).get("rewards", [])]
    culprits = [c for c in _culprit_components(findings) if c in names and c != "correctness"]
    if not culprits or len(names) < 2:
        return None
    c = culprits[0]
    why = "it pays a submit with no tested edit as much as a fix" if any(
        f.metric == f"reward_{c}_pays_premature_submit" for f in findings) else \
        "it dominates or diverges from the sealed grade"
    return Change({"harness.yaml": remove_reward(files["harness.yaml"], c)},
                  f"remove the reward component {c}",
                  f"If we remove {c}, dev accuracy holds or improves because {why}: the policy optimises it instead "
                  "of being right.")


def soft_overlong(files: Files, findings: list[Finding]) -> Change | None:
    names = [r["name"] for r in _spec(files).get("rewards", [])]
    if "soft_overlong" in names or _multi_turn(files):
        return None
    limit = int(_knob(files, "max_completion_length"))
    buffer = max(2, limit // 4)
    code = f'''
def soft_overlong(prompts, completions, completion_ids=None, **kwargs):
    """Soft overlong punishment (DAPO): 0 up to {limit - buffer} tokens, falling linearly to -1 at the
    {limit}-token limit, so the policy learns to finish before it is cut off."""
    lengths = [len(ids) for ids in completion_ids] if completion_ids is not None else [len(c) for c in completions]
    return [-min(1.0, max(0.0, (n - {limit - buffer}) / {buffer})) for n in lengths]
'''
    return Change({"harness.yaml": add_reward(files["harness.yaml"], "soft_overlong", 0.5, "soft overlong punishment"),
                   "rewards.py": _append_function(files["rewards.py"], "soft_overlong", code)},
                  f"add a soft overlong punishment (0 to -1 over the last {buffer} tokens, weight 0.5)",
                  "If completions are punished as they approach the length limit, truncation falls and dev accuracy "
                  "rises because truncated completions are masked or graded wrong.",
                  ExpectedEffect(metric="dev_accuracy", direction="up", size=0.01))


LAST_INTEGER = '''
def last_integer_correctness(prompts, completions, answer, **kwargs):
    """1.0 when the last integer the completion writes is the expected answer, else 0.0: reads a bare answer, an
    "Answer: N" line and the end of a worked answer alike."""
    import re

    out = []
    for completion, expected in zip(completions, answer):
        found = re.findall(r"-?\\d+", completion)
        out.append(1.0 if found and int(found[-1]) == int(expected) else 0.0)
    return out
'''


def answer_parser(files: Files, findings: list[Finding]) -> Change | None:
    """Right answers the reward does not pay (`unpaid_correct`): the component that withholds most is replaced by
    the plainest reading of a numeric answer there is, the last integer written, at the same weight."""
    unpaid = _fired(findings, "unpaid_correct")
    spec = _spec(files)
    if not unpaid or spec.get("domain") != "math":  # the math tasks' `answer` column is what it compares with
        return None
    rewards = {r["name"]: r.get("weight", 1.0) for r in spec.get("rewards", [])}
    component = unpaid[0].metric.removesuffix("_unpaid_correct").removeprefix("reward_")
    if "last_integer_correctness" in rewards or component not in rewards:
        return None
    return Change({"harness.yaml": rename_reward(files["harness.yaml"], component, "last_integer_correctness"),
                   "rewards.py": _append_function(files["rewards.py"], "last_integer_correctness", LAST_INTEGER)},
                  f"replace the reward component {component} by last_integer_correctness (weight "
                  f"{rewards[component]:g})",
                  f"If the reward reads the last integer a completion writes instead of {component}'s parser, the "
                  f"{unpaid[0].value:.0%} of right answers it paid nothing get a positive advantage and dev accuracy "
                  "improves.", ExpectedEffect(metric="dev_accuracy", direction="up", size=0.05))


# -- rewards of program synthesis (code domain) -------------------------------------------------------
RUNS_CLEANLY = '''
def runs_cleanly(prompts, completions, visible, **kwargs):
    """-1 when the program raises, hangs or is refused on a visible example, else 0: keeps a reward bug or a
    lenient test harness from making failing programs cheap."""
    examples = [json.loads(v) for v in visible]
    outcomes = run_functions([program(c) for c in completions], [[[x] for x, _ in ex] for ex in examples])
    return [-1.0 if o.status != "ok" or any(e is not None for e in o.errors) else 0.0 for o in outcomes]
'''

NO_LOOKUP = '''
def no_lookup(prompts, completions, visible, **kwargs):
    """-1 for a program that spells out the visible outputs inside a table or conditional (it fits the examples,
    not the function), else 0."""
    import re

    out = []
    for completion, v in zip(completions, visible):
        outputs = {y for _, y in json.loads(v)}
        literals = {int(n) for n in re.findall(r"(?<![\\w.])-?\\d+", completion)}
        lookup = re.search(r"[{\\[]|\\bif\\b|==|\\bin\\b", completion) is not None
        out.append(-1.0 if lookup and len(outputs) >= 3 and len(literals & outputs) >= max(3, len(outputs) - 1)
                   else 0.0)
    return out
'''


def _program_reward(files: Files, name: str, code: str, weight: float, comment: str, change: str,
                    hypothesis: str) -> Change | None:
    names = [r["name"] for r in _spec(files).get("rewards", [])]
    source = files.get("rewards.py", "")
    if name in names or "def program(" not in source or "run_functions" not in source:
        return None  # not a program-synthesis harness, or it has the reward already
    return Change({"harness.yaml": add_reward(files["harness.yaml"], name, weight, comment),
                   "rewards.py": _append_function(source, name, code)}, change, hypothesis,
                  ExpectedEffect(metric="dev_accuracy", direction="up", size=0.01))


def crash_penalty(files: Files, findings: list[Finding]) -> Change | None:
    if not _fired(findings, "execution_errors"):
        return None
    return _program_reward(files, "runs_cleanly", RUNS_CLEANLY, 0.5, "penalise programs that fail to run",
                           "add a reward runs_cleanly (-1 for a program that raises, hangs or is refused; weight 0.5)",
                           "If failing programs cost reward, the execution-error rate falls and dev accuracy rises "
                           "because the policy stops spending samples on programs that cannot pass.")


def lookup_penalty(files: Files, findings: list[Finding]) -> Change | None:
    if not (_fired(findings, "hard_coded_outputs") or _fired(findings, "visible_hidden_divergence")):
        return None
    return _program_reward(files, "no_lookup", NO_LOOKUP, 1.0, "penalise hard-coded visible outputs",
                           "add a reward no_lookup (-1 for a program that hard-codes the visible outputs; weight 1.0)",
                           "If a lookup table of the visible outputs no longer earns the visible-tests reward, hidden "
                           "pass and dev accuracy rise because only programs that compute the function are paid.")


# -- environment (multi-turn harnesses) -----------------------------------------------------------------
_TOOLS_LINE = re.compile(r"^TOOLS\s*=\s*\[([^\]]*)\]", flags=re.M)


def close_leak(files: Files, findings: list[Finding]) -> Change | None:
    """Remove from env.py's TOOLS the tools the leak analyzer caught: tools the sealed environment lacks."""
    fired = _fired(findings, "leak_usage")
    source = files.get("env.py", "")
    m = _TOOLS_LINE.search(source)
    if not fired or not m:
        return None
    from evotrainer.trainer.swe_env import SEALED_TOOLS

    tools = re.findall(r"[\"']([^\"']+)[\"']", m.group(1))
    leaks = [t for t in tools if t not in SEALED_TOOLS]
    if not leaks:
        return None
    kept = ", ".join(f'"{t}"' for t in tools if t not in leaks)
    line = f"TOOLS = [{kept}]  # removed {', '.join(leaks)}: sealed evaluation does not offer it (a leak)"
    usage = fired[0].value
    return Change({"env.py": _TOOLS_LINE.sub(line, source, count=1)},
                  f"remove the tool{'s' if len(leaks) > 1 else ''} {', '.join(leaks)} from env.py",
                  f"If training offers only the tools sealed evaluation has, the policy stops relying on "
                  f"{', '.join(leaks)} (leak usage {usage:.0%} now) and the sealed dev resolve rate rises because "
                  "what it learns is what it is graded on.",
                  ExpectedEffect(metric="dev_accuracy", direction="up", size=0.02))


_TURNS_LINE = re.compile(r"^MAX_TURNS\s*=\s*(\d+)", flags=re.M)


def more_turns(files: Files, findings: list[Finding]) -> Change | None:
    """Raise env.py's MAX_TURNS when episodes run out of turns before submitting: below the environment's default
    straight back to it (an episode cut off never shows how many turns it wanted), above it half as many again
    (at most the environment's ceiling of 32). Not while the context overflows in half as many episodes or more:
    there the context binds too, and more turns would overflow it instead."""
    cut = [f for f in _fired(findings, "context_overflow") if f.metric == "turn_limit_ratio"]
    full = [f.value for f in findings if f.analyzer == "context_overflow" and f.metric == "context_overflow_ratio"]
    source = files.get("env.py", "")
    m = _TURNS_LINE.search(source)
    if not cut or not m or (full and full[0] >= cut[0].value / 2):
        return None
    from evotrainer.trainer.swe_env import EnvConfig

    cur, default = int(m.group(1)), EnvConfig().max_turns
    new = default if cur < default else min(32, int(round(cur * 1.5)))
    if new <= cur:
        return None
    return Change({"env.py": _TURNS_LINE.sub(f"MAX_TURNS = {new}", source, count=1)},
                  f"raise the turn budget MAX_TURNS {cur} -> {new}",
                  f"If episodes get {new} turns, fewer end at the budget before they submit ({cut[0].value:.0%} "
                  "now), so more of them can search, edit, test and submit, and the sealed dev resolve rate rises.",
                  ExpectedEffect(metric="dev_accuracy", direction="up", size=0.02))


# -- recipe --------------------------------------------------------------------------------------------
def clip_higher(files: Files, findings: list[Finding]) -> Change | None:
    if int(_knob(files, "num_iterations", 1)) <= 1 and int(_knob(files, "steps_per_generation", 1)) <= 1:
        return None  # one update per generated batch: the ratio is 1 and no clip bound ever binds (measured: a no-op)
    eps = float(_knob(files, "epsilon", 0.2))
    high = float(_knob(files, "epsilon_high", eps))
    if high >= 0.4:
        return None
    new = round(high + 0.08, 3)
    return _knob_change(files, "epsilon_high", new, f"raise the upper clip bound epsilon_high {high:g} -> {new:g}",
                        "If the upper clip bound is higher, low-probability good tokens can grow faster, entropy "
                        "stays up and dev accuracy improves.")


def more_iterations(files: Files, findings: list[Finding]) -> Change | None:
    if _fired(findings, "optimizer_health") or int(_knob(files, "num_iterations", 1)) > 1:
        return None
    return _knob_change(files, "num_iterations", 2, "take two optimisation passes over each generated batch "
                                                    "(num_iterations 1 -> 2)",
                        "If each batch is used for two updates, the policy moves further per generated sample (on "
                        "CPU, generation dominates a step) and dev accuracy improves; the clip bounds now bind.")


def loss_type(files: Files, findings: list[Finding]) -> Change | None:
    cur = _knob(files, "loss_type", "dapo")
    new = {"dapo": "dr_grpo", "grpo": "dapo", "bnpo": "dapo", "dr_grpo": "dapo"}.get(cur)
    if new is None:
        return None
    return _knob_change(files, "loss_type", new, f"change the loss aggregation {cur} -> {new}",
                        f"If the loss is aggregated as {new}, the length bias of {cur} goes and dev accuracy improves.")


def dr_grpo_objective(files: Files, findings: list[Finding]) -> Change | None:
    """Dr. GRPO's objective (Liu et al. 2025, "Understanding R1-Zero-like training"): the policy gradient without
    either of GRPO's two normalisations, a sum over tokens divided by a constant instead of each completion's length,
    and advantages not divided by the group's standard deviation. One factor, two keys: the paper derives both as
    biases of the same objective, and the halves tested alone measure half the effect each (docs/results/README.md,
    code). Not where either half is already set, nor on a loss Dr. GRPO does not start from (grpo: per-sequence)."""
    loss, scale = _knob(files, "loss_type", "dapo"), str(_knob(files, "scale_rewards", "group"))
    if loss not in ("dapo", "bnpo") or scale != "group":
        return None
    text = set_knob(files["harness.yaml"], "loss_type", "dr_grpo", comment="Dr. GRPO's objective: no length "
                                                                             "normalisation")
    text = set_knob(text, "scale_rewards", "none", comment="Dr. GRPO's objective: no std normalisation")
    return Change({"harness.yaml": text},
                  f"train on Dr. GRPO's objective (loss_type {loss} -> dr_grpo, scale_rewards group -> none)",
                  "If the policy gradient drops both of GRPO's normalisations (per-completion length and the group's "
                  "reward spread), easy and hard prompts and short and long answers weigh as they should, and dev "
                  "accuracy improves.",
                  ExpectedEffect(metric="dev_accuracy", direction="up", size=0.01))


def more_generations(files: Files, findings: list[Finding]) -> Change | None:
    """Larger groups at the same batch (fewer prompts a step). Where `small_groups` measured the size the solve rates
    need (`group_size_needed`), the smallest size a batch holds whole that reaches it, or the largest it holds when
    none does; with no such measurement, twice the group. At most 32."""
    ng = int(_knob(files, "num_generations"))
    bs = int(_knob(files, "per_device_train_batch_size"))
    sizes = [g for g in range(ng + 1, 33) if bs % g == 0]
    need = [f for f in findings if f.analyzer == "small_groups" and f.metric == "group_size_needed"]
    if need and _fired(findings, "small_groups") and sizes:
        new = next((g for g in sizes if g >= need[0].value), sizes[-1])
    elif ng * 2 in sizes:
        new = ng * 2
    else:
        return None
    return _knob_change(files, "num_generations", new, f"sample {new} completions per prompt instead of {ng}",
                        "If each group holds more samples, fewer groups are all-failed or all-solved and dev "
                        "accuracy improves because more prompts carry a nonzero advantage.")


def temperature(files: Files, findings: list[Finding]) -> Change | None:
    cur = float(_knob(files, "temperature", 1.0))
    if cur >= 1.4:
        return None
    # below 1 the sampler is sharper than the policy it trains: back to the policy's own distribution first
    new = 1.0 if cur < 1.0 else round(cur + 0.2, 2)
    return _knob_change(files, "temperature", new, f"raise the sampling temperature {cur:g} -> {new:g}",
                        "If sampling is hotter, groups are more diverse, fewer are dead, and dev accuracy improves.")


def longer_limit(files: Files, findings: list[Finding]) -> Change | None:
    if not _fired(findings, "truncation") or _multi_turn(files):
        return None
    cur = int(_knob(files, "max_completion_length"))
    # a limit below the backend's default was sized on some answers only: back to the default at once (truncated
    # completions never show how long they wanted to be); above it, half as much again
    default = int(TRAINER_DEFAULTS["max_completion_length"])
    new = default if cur < default else int(round(cur * 1.5))
    return _knob_change(files, "max_completion_length", new, f"raise the completion-length limit {cur} -> {new}",
                        f"If the limit is {new} tokens, fewer completions are cut off and masked, so more rollouts "
                        "carry gradient and dev accuracy improves.")


HEALTHY_UPDATE = 1e-3  # ||dw|| / ||w|| per step of the CPU policy at its tuned rate (the update_size analyzer)


def healthy_update(files: Files) -> float:
    """What a step of this harness's policy moves at a good rate: the CPU policy's, scaled as the harness scaled the
    `update_size` analyzer's warning for its own policy (the swe template's: a third of it)."""
    default = REGISTRY["update_size"].defaults["warning"]
    own = ((_spec(files).get("analyzers") or {}).get("update_size") or {}).get("warning", default)
    return HEALTHY_UPDATE * float(own) / default


def learning_rate(files: Files, findings: list[Finding]) -> Change | None:
    if _fired(findings, "optimizer_health") or _fired(findings, "logprob_collapse"):
        return None  # unstable or collapsing already: a bigger step would make it worse
    cur = float(_knob(files, "learning_rate"))
    small = _fired(findings, "update_size")
    if cur >= 3e-4 and not small:
        return None
    # updates measured too small: scaled toward the update size of a healthy run (Adam's step is about proportional
    # to the rate), at most tenfold; with no measurement a cautious 1.5x
    factor = min(10.0, max(1.5, healthy_update(files) / small[0].value)) if small and small[0].value > 0 else 1.5
    new = float(f"{cur * factor:.3g}")
    return _knob_change(files, "learning_rate", new, f"raise the learning rate {cur:g} -> {new:g}",
                        "If the step is larger, the policy moves further toward the solutions it already samples "
                        "(pass@k above greedy accuracy) and dev accuracy improves.")


def kl_coefficient(files: Files, findings: list[Finding]) -> Change | None:
    if not (_fired(findings, "optimizer_health") or _fired(findings, "logprob_collapse")):
        return None
    cur = float(_knob(files, "beta", 0.0))
    new = 0.02 if cur == 0 else round(cur * 2, 4)
    return _knob_change(files, "beta", new, f"set the KL coefficient beta {cur:g} -> {new:g}",
                        "If updates are held near the reference policy, the instability the optimizer health report "
                        "shows goes away and dev accuracy stops eroding.")


def mask_truncated(files: Files, findings: list[Finding]) -> Change | None:
    trunc = _fired(findings, "truncation")
    if not trunc:
        return None
    cur = bool(_knob(files, "mask_truncated_completions", False))
    return _knob_change(files, "mask_truncated_completions", not cur,
                        f"{'stop masking' if cur else 'mask'} truncated completions in the loss",
                        f"If truncated completions are {'kept with their (low) reward' if cur else 'masked'}, "
                        f"the {trunc[0].value:.0%} cut-off rollouts "
                        f"{'teach the policy to finish' if cur else 'stop adding noise'} and dev accuracy improves.")


def scale_rewards(files: Files, findings: list[Finding]) -> Change | None:
    cur = _knob(files, "scale_rewards", "group")
    new = {"group": "batch", "batch": "none", "none": "group"}.get(str(cur))
    if new is None:
        return None
    return _knob_change(files, "scale_rewards", new, f"normalise advantages by {new} instead of {cur}",
                        f"If advantages are scaled by {new}, low-spread groups stop amplifying noise and dev accuracy "
                        "improves.")


# -- diagnostics (applied by diagnostics revision) -----------------------------------------------------
def divergence_gate_code(component: str, rise: float = 0.02) -> tuple[str, str]:
    """A harness analyzer gating one reward column that rises while `correct` does not: (path, source)."""
    col = component if component == "reward" else f"reward_{component}"
    aid = f"divergence_gate_{component}"
    src = f'''"""Divergence gate for {col}, written by diagnostics revision: a candidate's train reward rose while
sealed dev did not, and no gate fired."""

from evotrainer.trainer.diagnostics import Finding, analyzer


@analyzer("{aid}", rise={rise})
def {aid}(r, s, t):
    """{col} rose by more than `rise` between the first and the last third of steps while the sealed correct
    rate did not rise: the component is paid for something other than being right."""
    if "{col}" not in r or r["step"].nunique() < 3:
        return []
    lo, hi = r["step"].quantile(1 / 3), r["step"].quantile(2 / 3)
    first, last = r[r["step"] <= lo], r[r["step"] >= hi]
    d = float(last["{col}"].mean() - first["{col}"].mean())
    d_correct = float(last["correct"].mean() - first["correct"].mean())
    if d <= t["rise"] or d_correct > 0:
        return []
    ids = last.loc[~last["correct"].astype(bool), "rollout_id"].head(20).tolist()
    return [Finding(analyzer="{aid}", metric="{col}_rise", value=d, threshold=t["rise"], severity="critical",
                    gate=True, message=f"{col} rose {{d:+.3f}} while correct moved {{d_correct:+.3f}}", evidence=ids)]
'''
    return f"diagnostics/{aid}.py", src


def divergence_gate(files: Files, findings: list[Finding]) -> Change | None:
    components = [r["name"] for r in _spec(files).get("rewards", []) if r["name"] != "correctness"]
    culprit = next((c for c in _culprit_components(findings) if c in components), None) or \
        (components[0] if components else "reward")
    change = divergence_gate_change(culprit)
    return None if set(change.files) <= set(files) else change


def divergence_gate_change(culprit: str) -> Change:
    """The divergence gate on one reward component, as a change (the transform, and diagnostics revision)."""
    path, src = divergence_gate_code(culprit)
    return Change({path: src}, f"add a divergence gate on {culprit}",
                  f"If {culprit} is gated against the sealed grade, a candidate whose train reward rises without dev "
                  "is blocked before promotion.", ExpectedEffect(metric="missed_gates", direction="down", size=1))


def tighten_truncation(files: Files, findings: list[Finding]) -> Change | None:
    if _multi_turn(files):
        return None
    t = (_spec(files).get("analyzers") or {}).get("truncation") or {"warning": 0.05, "critical": 0.10}
    if t.get("warning", 0.05) <= 0.02:
        return None
    new = {"warning": round(t.get("warning", 0.05) / 2, 4), "critical": round(t.get("critical", 0.10) / 2, 4)}
    return Change({"harness.yaml": set_threshold(files["harness.yaml"], "truncation", new)},
                  f"tighten the truncation thresholds to {new}",
                  "If truncation is flagged earlier, a length problem is found before it costs gradient.",
                  ExpectedEffect(metric="missed_findings", direction="down", size=1))


# `explore`: a recipe-level change worth testing on any harness, proposed with no finding calling for it, larger
# first while memory has measured neither (after that, what memory measured ranks them: policy.py). The order:
# Dr. GRPO's objective first, both halves at once (`docs/results/wave1/`: the dr_grpo recipe measured +0.012 [-0.001,
# +0.023] on code; the second comparison +0.016 [+0.005, +0.027], while the loop testing each half alone promoted
# one half on two seeds of three), then each half alone (its length-unbiased loss, its advantage scaling), DAPO's
# dynamic sampling (zero_var: +0.005 on code), sampling temperature and
# group size; more updates per batch low (the clip_higher recipe, which needs them, measured -0.016 and -0.026);
# the learning rate last (the templates' was tuned, DESIGN §12). Reward, filter and environment changes wait for
# a finding: a reward edited with no evidence of a problem is an invitation to a hack.
CATALOG: dict[str, Transform] = {t.id: t for t in [
    Transform("drop_dead_groups", "filters.group_filters", "filters", "drop zero-variance groups (dynamic sampling)",
              {"dead_groups": 1.0, "reward_spread": 0.4}, 0.4, drop_dead_groups),
    Transform("curriculum_drop_unsolved", "filters.curriculum", "filters", "leave out never-solved levels",
              {"solve_rate_by_difficulty": 1.0, "dead_groups": 0.3}, 0.0, curriculum_drop_unsolved),
    Transform("format_weight", "reward.format_weight", "reward", "raise the format reward weight",
              {"format_failures": 1.0}, 0.0, format_weight),
    Transform("partial_credit", "reward.partial_credit", "reward", "guarded partial credit for near misses",
              {"reward_spread": 1.0, "dead_groups": 0.6}, 0.0, partial_credit),
    Transform("answer_parser", "reward.parser", "reward", "read the answer as the last integer written",
              {"unpaid_correct": 1.5}, 0.0, answer_parser),
    Transform("remove_component", "reward.components", "reward", "remove a dominating or diverging component",
              {"component_dominance": 1.0, "shaped_vs_sealed": 1.2, "premature_submit": 1.0}, 0.0, remove_component),
    Transform("soft_overlong", "reward.overlong", "reward", "soft overlong punishment",
              {"truncation": 1.0, "length_reward_correlation": 0.5}, 0.0, soft_overlong),
    Transform("crash_penalty", "reward.execution", "reward", "penalise programs that fail to run",
              {"execution_errors": 1.0, "shaped_vs_sealed": 0.5}, 0.0, crash_penalty),
    Transform("lookup_penalty", "reward.lookup", "reward", "penalise hard-coded visible outputs",
              {"hard_coded_outputs": 1.2, "visible_hidden_divergence": 1.0}, 0.0, lookup_penalty),
    Transform("close_leak", "env.tools", "env", "remove tools the sealed evaluation lacks",
              {"leak_usage": 1.5}, 0.0, close_leak),
    Transform("more_turns", "env.max_turns", "env", "raise the turn budget of an episode",
              {"context_overflow": 1.5}, 0.0, more_turns),
    Transform("clip_higher", "recipe.epsilon_high", "recipe", "raise the upper clip bound",
              {"logprob_collapse": 1.0, "optimizer_health": 0.3}, 0.15, clip_higher),
    Transform("more_iterations", "recipe.num_iterations", "recipe", "two updates per generated batch",
              {}, 0.1, more_iterations),
    Transform("dr_grpo_objective", "recipe.objective", "recipe", "Dr. GRPO's objective (both normalisations off)",
              {"length_reward_correlation": 0.8, "reward_spread": 0.5}, 0.6, dr_grpo_objective,
              sets=("loss_type", "scale_rewards")),
    Transform("loss_type", "recipe.loss_type", "recipe", "change the loss aggregation",
              {"length_reward_correlation": 1.0}, 0.5, loss_type),
    Transform("more_generations", "recipe.num_generations", "recipe", "more completions per prompt",
              {"dead_groups": 0.8, "reward_spread": 0.3, "small_groups": 1.2}, 0.25, more_generations),
    Transform("temperature", "recipe.temperature", "recipe", "raise the sampling temperature",
              {"dead_groups": 0.5, "logprob_collapse": 1.0, "identical_samples": 1.5}, 0.3, temperature),
    Transform("longer_limit", "recipe.max_completion_length", "recipe", "raise the completion-length limit",
              {"truncation": 1.2}, 0.0, longer_limit),
    Transform("learning_rate", "recipe.learning_rate", "recipe", "raise the learning rate",
              {"update_size": 1.5}, 0.05, learning_rate),
    Transform("kl_coefficient", "recipe.beta", "recipe", "add or raise the KL penalty",
              {"optimizer_health": 1.0, "logprob_collapse": 0.5}, 0.0, kl_coefficient),
    Transform("mask_truncated", "recipe.mask_truncated_completions", "recipe", "toggle masking of truncated ones",
              {"truncation": 0.6}, 0.0, mask_truncated),
    Transform("scale_rewards", "recipe.scale_rewards", "recipe", "change the advantage normalisation",
              {"reward_spread": 0.8}, 0.45, scale_rewards),
    Transform("divergence_gate", "diagnostics.gate", "diagnostics", "gate a reward component against correct",
              {"shaped_vs_sealed": 1.0}, 0.0, divergence_gate),
    Transform("tighten_truncation", "diagnostics.threshold", "diagnostics", "tighten the truncation thresholds",
              {"truncation": 1.0}, 0.0, tighten_truncation),
]}


def apply(transform_id: str, files: Files, findings: list[Finding]) -> Change | None:
    """The transform's change to `files`, or None when its precondition does not hold or the text is not laid
    out as the edit expects."""
    try:
        return CATALOG[transform_id].make(files, findings)
    except (EditError, KeyError, ValueError):
        return None
