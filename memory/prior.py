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

A measurement made in another domain than the one being tested says less about this one: its variance gets
default_sd^2 on top (the spread of what a change does where nothing is known), so it moves the prior's mean toward
its sign but never makes it tight. Without that, one math backtest of a curriculum (+0.044 +- 0.009) was a prior
N(+0.036, 0.008^2) for code, and turned a code short run that measured -0.006 into P(gain) 0.91.
"""

from __future__ import annotations

import math

from pydantic import BaseModel

from evotrainer.memory.skill import Validation
from evotrainer.memory.store import SkillStore

UNMEASURED = "no measurement in memory"  # how a vague prior's source begins


class Prior(BaseModel):
    mean: float
    sd: float
    n: int  # validations it rests on
    source: str  # in words: what it was built from

    @classmethod
    def vague(cls, sd: float) -> Prior:
        return cls(mean=0.0, sd=sd, n=0, source=f"{UNMEASURED}: N(0, {sd:g}^2)")


def combine(validations: list[Validation], default_sd: float, domain: str | None = None) -> Prior:
    """The random-effects prior from measured validations (those with an effect and an interval), for a test in
    `domain` (None: every measurement counts as this domain's)."""
    measured = [(v.effect, v.se ** 2 + (default_sd ** 2 if domain and v.domain != domain else 0.0))
                for v in validations if v.effect is not None and v.se]
    if not measured:
        return Prior.vague(default_sd)
    w = [1 / var for _, var in measured]
    fixed = sum(wi * e for wi, (e, _) in zip(w, measured)) / sum(w)
    q = sum(wi * (e - fixed) ** 2 for wi, (e, _) in zip(w, measured))
    c = sum(w) - sum(wi ** 2 for wi in w) / sum(w)
    tau2 = max(0.0, (q - (len(measured) - 1)) / c) if len(measured) > 1 and c > 0 else 0.0
    w_re = [1 / (var + tau2) for _, var in measured]
    precision = 1 / default_sd ** 2 + sum(w_re)
    mean = sum(wi * e for wi, (e, _) in zip(w_re, measured)) / precision
    sd = math.sqrt(1 / precision + tau2)
    elsewhere = sum(1 for v in validations if v.effect is not None and v.se and domain and v.domain != domain)
    return Prior(mean=mean, sd=sd, n=len(measured),
                 source=f"{len(measured)} measured backtest(s) in memory"
                        + (f", {elsewhere} in other domains" if elsewhere else "") + f": N({mean:+.4f}, {sd:.4f}^2)")


def priors_for(store: SkillStore, transforms: list[str], default_sd: float,
               domain: str | None = None) -> dict[str, Prior]:
    """`prior_for` of many catalog transforms at once, the store read once."""
    skills = store.list()
    return {t: combine([v for s in skills if s.transform == t for v in s.validations], default_sd, domain)
            for t in transforms}


def prior_for(store: SkillStore, transform: str | None, factor: str, default_sd: float,
              domain: str | None = None) -> Prior:
    """The prior for the next test of a change in `domain`: every stored validation of the same transform (else
    factor), those of other domains counted as weaker evidence."""
    skills = [s for s in store.list() if (s.transform == transform if transform else s.factor == factor)]
    return combine([v for s in skills for v in s.validations], default_sd, domain)


def applied_again(prior: Prior, generation: int, sd: float) -> Prior:
    """The prior for a change the champion's line already promoted (in `generation`), tested once more: memory's
    measurements of it (this very promotion among them) are of its first application and say nothing of going
    further the same way, so the next test is judged on its own evidence under N(0, sd^2). Without this a second
    learning-rate raise inherited the first one's +0.032 and read its measured -0.035 as +0.002."""
    return Prior(mean=0.0, sd=sd, n=0, source=f"{UNMEASURED} of applying it again (promoted on this line in "
                                              f"generation {generation}; memory's {prior.n} test(s) measured its "
                                              f"first application): N(0, {sd:g}^2)")


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
