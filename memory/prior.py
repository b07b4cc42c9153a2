"""Skill memory as a prior (empirical Bayes): what the store has measured of a change, as a normal distribution
for the next test of it.

Every validation of a skill with the same catalog transform (or, for a change outside the catalog, the same
factor), in any run and domain, is one measured effect e_i with its standard error se_i. The change's mean effect
mu starts from N(0, default_sd^2) (what is known of a change never measured) and each measurement is
e_i ~ N(mu, se_i^2 + tau^2), tau^2 the between-test variance (DerSimonian-Laird from their spread; 0 with one
measurement); the prior for the next test is the predictive distribution of its true effect:
N(mean of mu, var of mu + tau^2). With nothing measured it is N(0, default_sd^2). A new short run is then shrunk
toward what the store knows: a change measured near zero many times needs a clear effect to be promoted, one
measured positive before needs less; and repeated tests of one change pool their evidence.
"""

from __future__ import annotations

import math

from pydantic import BaseModel

from evotrainer.memory.skill import Validation
from evotrainer.memory.store import SkillStore


class Prior(BaseModel):
    mean: float
    sd: float
    n: int  # validations it rests on
    source: str  # in words: what it was built from

    @classmethod
    def vague(cls, sd: float) -> Prior:
        return cls(mean=0.0, sd=sd, n=0, source=f"no measurement in memory: N(0, {sd:g}^2)")


def combine(validations: list[Validation], default_sd: float) -> Prior:
    """The random-effects prior from measured validations (those with an effect and an interval)."""
    measured = [(v.effect, v.se) for v in validations if v.effect is not None and v.se]
    if not measured:
        return Prior.vague(default_sd)
    w = [1 / se ** 2 for _, se in measured]
    fixed = sum(wi * e for wi, (e, _) in zip(w, measured)) / sum(w)
    q = sum(wi * (e - fixed) ** 2 for wi, (e, _) in zip(w, measured))
    c = sum(w) - sum(wi ** 2 for wi in w) / sum(w)
    tau2 = max(0.0, (q - (len(measured) - 1)) / c) if len(measured) > 1 and c > 0 else 0.0
    w_re = [1 / (se ** 2 + tau2) for _, se in measured]
    precision = 1 / default_sd ** 2 + sum(w_re)
    mean = sum(wi * e for wi, (e, _) in zip(w_re, measured)) / precision
    sd = math.sqrt(1 / precision + tau2)
    return Prior(mean=mean, sd=sd, n=len(measured),
                 source=f"{len(measured)} measured backtest(s) in memory: N({mean:+.4f}, {sd:.4f}^2)")


def priors_for(store: SkillStore, transforms: list[str], default_sd: float) -> dict[str, Prior]:
    """`prior_for` of many catalog transforms at once, the store read once."""
    skills = store.list()
    return {t: combine([v for s in skills if s.transform == t for v in s.validations], default_sd)
            for t in transforms}


def prior_for(store: SkillStore, transform: str | None, factor: str, default_sd: float) -> Prior:
    """The prior for the next test of a change: every stored validation of the same transform (else factor)."""
    skills = [s for s in store.list() if (s.transform == transform if transform else s.factor == factor)]
    return combine([v for s in skills for v in s.validations], default_sd)


def expected_gain(prior: Prior) -> float:
    """What testing the change is expected to gain: E[max(effect, 0)] under the prior (the expected improvement of
    Bayesian optimisation), since a test that finds a loss is rejected and costs only its compute. A change memory
    knows nothing of gets sd x 0.399; one measured near zero many times, little; one measured positive, more. It is
    the exploration score the offline Planner ranks by."""
    if prior.sd <= 0:
        return max(prior.mean, 0.0)
    z = prior.mean / prior.sd
    pdf = math.exp(-z * z / 2) / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1 + math.erf(z / math.sqrt(2)))
    return prior.mean * cdf + prior.sd * pdf
