"""A run's configuration, `run.yaml`, in one place: every setting, its default and what it does.

    RunConfig                        run.yaml
    ├── budget: Budget               when the loop stops
    └── loop: LoopConfig             how one generation spends compute
        ├── backtest: BacktestConfig the short runs that measure a candidate
        └── promotion: PromotionRule what the Critic requires of a winner

`loop_config(domain, overrides)` is a new run's loop: these defaults, the domain's (`DOMAIN_DEFAULTS`), then the
caller's overrides (the CLI's options, a comparison's budget). Everything here is data: the parts that act on it
(the loop, the backtests, the Critic) import it from here.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Budget(BaseModel):
    """When a run stops: the first limit reached ends it after the generation in progress."""

    model_config = ConfigDict(extra="forbid")
    generations: int = Field(3, ge=1, description="generations of the loop")
    candidates: int = Field(3, ge=1, description="candidate interventions per generation")
    train_steps: int | None = Field(None, description="total GRPO steps, backtests included")
    llm_dollars: float | None = Field(None, description="spend limit of the meta-LLM")
    wall_clock_s: float | None = Field(None, description="wall-clock limit of the whole run")


class BacktestConfig(BaseModel):
    """The short runs of a candidate's backtest: candidate and control arms trained from the champion's policy on
    the same seeds, compared on sealed dev, extended seed by seed while the answer is open."""

    model_config = ConfigDict(extra="forbid")
    steps: int = Field(5, ge=1, description="GRPO steps of each arm")
    seeds: int = Field(2, ge=1, description="seeds of the first round")
    max_seeds: int = Field(3, ge=1, description="sequential extension: add seeds up to this many (never fewer than "
                                                "`seeds`) while the estimate is positive and its interval straddles "
                                                "zero")
    dev_items: int | None = Field(500, ge=1, description="sealed dev items of every evaluation of the loop, the "
                                                         "champion's included (None: all)")
    bootstrap: int = Field(2000, ge=100, description="bootstrap resamples of the paired difference")
    seed_sd: float = Field(0.006, ge=0.0, description="between-seed spread of a paired short-run effect, which the "
                                                     "bootstrap of a one-seed backtest cannot see (its items only): "
                                                     "added to its error in quadrature. 0.006: the paired recipe "
                                                     "effects of docs/results/wave1, 3 seeds, item noise removed")
    parallel: int = Field(2, ge=1, description="training children side by side (one core each)")

    @model_validator(mode="after")
    def _at_least_the_first_round(self) -> BacktestConfig:
        self.max_seeds = max(self.max_seeds, self.seeds)
        return self


class PromotionRule(BaseModel):
    """What the Critic requires of a winner. Configurable, never bypassed: a failed gate always vetoes.

    The short run's paired dev effect is combined with a prior for the change (what skill memory has measured of the
    same transform, else a normal centred on zero with `prior_sd`) into a normal posterior. Promote when every gate
    passes, the posterior probability of a gain is at least `level`, and its 2.5% quantile is above `-margin`
    (non-inferiority): under the prior, a promoted change is a loss with probability at most 1 - level and a loss
    of more than `margin` with probability at most 2.5%. Reject when a gate fails or the posterior probability of
    a gain is at most 1 - level (measured harmful); otherwise the verdict is inconclusive: the evidence is kept, and
    memory records it as such, not as a negative lesson (docs/architecture.md, "The promotion rule")."""

    model_config = ConfigDict(extra="forbid")
    level: float = Field(0.9, gt=0.5, lt=1.0, description="posterior probability of a dev gain a promotion requires")
    margin: float = Field(0.01, ge=0.0, description="non-inferiority: the posterior's 2.5% quantile must exceed "
                                                    "-margin")
    prior_sd: float = Field(0.02, gt=0.0, description="spread of the prior for a change memory knows nothing of: "
                                                      "short-run dev effects here lie within about +-0.02")
    min_ci_low: float | None = Field(None, description="optional frequentist floor as well: the paired dev "
                                                       "interval's lower bound must exceed this (older runs: 0.0)")
    max_promotions: int = Field(1, ge=0, description="winners per generation")
    repair_margin: float = Field(0.0, ge=0.0, description="a candidate that repairs a gate the champion fails is "
                                                          "promoted unless its paired 95% interval lies below "
                                                          "-repair_margin against the champion's arm and against the "
                                                          "policy both arms started from")
    fix_margin: float | None = Field(0.0, ge=0.0, description="a candidate that fixes a defect the main line shows "
                                                             "at critical severity (`agents/critic.py::fixes_of`) is "
                                                             "promoted unless measured harmful against the champion's "
                                                             "arm: its paired 95% interval below -fix_margin, or a "
                                                             "gain no more probable than 1 - level; null: such a fix "
                                                             "is judged as any other change")
    revise_reward_rise: float = Field(0.02, description="train reward rise beyond the train correct rise (candidate "
                                                        "minus control, both under the candidate's reward) without a "
                                                        "dev gain that asks for diagnostics revision")
    replay_only: bool = Field(False, description="set from `loop.short_runs` (`LoopConfig.rule`): with no short run, "
                                                 "promote when every gate passes and the replay moved the "
                                                 "hypothesised metric its way")


# the flat keys of run.yaml before `backtest:` and `promotion:` were nested: older runs still load
_LEGACY = {"backtest_steps": ("backtest", "steps"), "seeds": ("backtest", "seeds"),
           "max_seeds": ("backtest", "max_seeds"), "dev_items": ("backtest", "dev_items"),
           "min_ci_low": ("promotion", "min_ci_low"), "max_promotions": ("promotion", "max_promotions")}


class LoopConfig(BaseModel):
    """How one generation of `evotrainer run` spends compute. The defaults fit three generations of three
    candidates into about 20 minutes on 2 cores (README: the loop); real gains need longer short runs."""

    model_config = ConfigDict(extra="forbid")
    train_steps: int = Field(10, ge=1, description="GRPO steps of the champion per generation")
    repair_rounds: int = Field(2, ge=0, description="Coder repair rounds fed the validation error")
    backtest: BacktestConfig = Field(default_factory=BacktestConfig)
    promotion: PromotionRule = Field(default_factory=PromotionRule)
    # ablations (evotrainer compare): each switches one part of the loop off
    revise_diagnostics: bool = Field(True, description="write a new analyzer when a candidate's train reward rose "
                                                       "without dev and no gate fired")
    skill_memory: bool = Field(True, description="the Planner reads skill memory and distill writes to it")
    short_runs: bool = Field(True, description="short runs on sealed dev; off: replay-only backtests, promotion on "
                                               "the replay's evidence alone")

    @model_validator(mode="before")
    @classmethod
    def _nest_legacy_keys(cls, data):
        return nest(data) if isinstance(data, dict) else data

    def horizon(self, generations: int) -> int:
        """The main line's horizon: one continuous training line (TRL's max_steps, so the learning-rate schedule and
        the data order are the line's) long enough for every generation's champion steps and a promoted short run
        in each. The reference a comparison measures EvoTrainer against trains on the same horizon."""
        return generations * (self.train_steps + self.backtest.steps)

    def rule(self) -> PromotionRule:
        """The promotion rule the loop's Critic and `backtest --judge` apply."""
        return self.promotion.model_copy(update={"replay_only": not self.short_runs})


def nest(flat: dict) -> dict:
    """Loop settings with the flat keys of older run.yaml files (`backtest_steps`, `seeds`, `min_ci_low`, ...)
    moved under `backtest:` and `promotion:`."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in flat.items() if k not in _LEGACY}
    for key, (section, field) in _LEGACY.items():
        if key in flat:
            out.setdefault(section, {})[field] = flat[key]
    return out


def merged(*layers: dict) -> dict:
    """Nested dicts merged left to right (a later layer's value wins, sections merge key by key)."""
    out: dict = {}
    for layer in layers:
        for k, v in nest(layer).items():
            out[k] = {**out[k], **v} if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# Per-domain loop settings where the general defaults do not fit. SWE: a step of 32 episodes takes ~9 s here and
# a sealed evaluation ~0.15 s per episode, while the effects at stake (a leak learnt within tens of steps) need
# short runs longer than the general 5 steps to show on sealed dev. About 13 minutes a generation on 2 cores.
DOMAIN_DEFAULTS: dict[str, dict] = {"swe": {"train_steps": 12, "backtest": {"steps": 10, "dev_items": 200}}}


def loop_config(domain: str, overrides: dict | None = None) -> LoopConfig:
    """The loop settings of a new run: the general defaults, the domain's (`DOMAIN_DEFAULTS`), then `overrides`."""
    return LoopConfig(**merged(DOMAIN_DEFAULTS.get(domain, {}), overrides or {}))


class RunConfig(BaseModel):
    """`run.yaml`."""

    model_config = ConfigDict(extra="forbid")
    name: str
    domain: str
    seed: int = 0
    budget: Budget = Field(default_factory=Budget)
    meta_llm: str = Field("offline", description="'offline' (rule-based meta-policy), 'local[:MODEL]' (a server on "
                                                 "127.0.0.1) or a LiteLLM model string")
    api_base: str | None = None
    llm_timeout_s: float | None = Field(None, description="wall clock of one meta-LLM attempt (None: the client's "
                                                          "default)")
    llm_retries: int | None = Field(None, description="attempts per meta-LLM call, 1 for no retry (None: the "
                                                      "client's default)")
    llm_cost_per_mtok: list[float] | None = Field(None, description="dollars per million input and output tokens, "
                                                                    "for a meta-LLM LiteLLM has no price for")
    skills: str | None = Field(None, description="skill memory path (default ~/.evotrainer/skills)")
    checkpoint: str | None = Field(None, description="starting policy (default: the domain's cached warm policy)")
    harness: str | None = Field(None, description="starting harness directory (default: the domain's template); "
                                                  "its digest is in the gen-0 tag")
    loop: LoopConfig = Field(default_factory=LoopConfig)
    fingerprint: str = Field(description="sealed scorer fingerprint at creation; every evaluation re-checks it")
