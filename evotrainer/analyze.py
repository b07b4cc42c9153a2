"""`evotrainer analyze RUN...`: the three trajectory analyses over one or many runs, as Markdown and PNG.

1. **Retained strategies**: which changes each domain kept (promoted), by generation, against how often each was
   tested.
2. **Invalid branches blocked**: every candidate a gate rejected, which gate (a built-in analyzer or one diagnostics
   revision wrote, with the run and generation it was born in), its train reward against its control and its sealed
   dev effect: a branch whose reward rose while dev did not is what the gates are there to stop.
3. **Skills shaping search**: each candidate a retrieved skill informed (the plan cites it), what the skill said
   (outcome, effect, the domains it was learned in) and what the candidate then did; per run, how many candidates
   it tried before its first promotion, with and without skills in its plans.

Everything is read as `evotrainer report` reads a run (`report.read_run`) plus the plans (`reports/plan-g*.json`)
and the run's skill store; a run in progress contributes what it has judged so far.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

from pydantic import BaseModel, ValidationError

from evotrainer.agents.schemas import Plan
from evotrainer.base.errors import UserError
from evotrainer.base.files import atomic_write_text
from evotrainer.memory.prior import UNMEASURED
from evotrainer.report import RunReport, read_run, status_of


class SkillCite(BaseModel):
    id: str
    outcome: str  # positive / negative / inconclusive, or unknown (the store is gone or lacks it)
    effect: float | None = None
    domains: list[str] = []  # where its validations were measured
    transform: str | None = None


class CandidateFact(BaseModel):
    """One judged (or open) candidate of one run, as the analyses read it."""

    run: str
    domain: str
    generation: int
    branch: str
    factor: str
    transform: str | None
    status: str  # promoted / gate / rejected / inconclusive / open
    effect: float | None  # paired sealed dev effect, candidate minus control
    p_gain: float | None
    failed_gates: list[str]
    train_reward_delta: float | None  # candidate minus control, short run
    train_correct_delta: float | None
    skills: list[SkillCite]
    prior: str = ""  # what memory had measured of the change when it was judged (the verdict's words); "" none


class RunFacts(BaseModel):
    run: str
    path: str
    domain: str
    candidates: list[CandidateFact]
    born: dict[str, int]  # analyzer written by diagnostics revision -> the generation it was committed in


class Analysis(BaseModel):
    runs: list[RunFacts]

    def candidates(self) -> list[CandidateFact]:
        return [c for r in self.runs for c in r.candidates]


def _plans(path: Path) -> dict[str, list[str]]:
    """Intervention id -> the skill ids its plan cited, over every plan of the run."""
    cited: dict[str, list[str]] = {}
    for p in sorted((path / "reports").glob("plan-g*.json")):
        try:
            plan = Plan.model_validate_json(p.read_text())
        except (ValidationError, ValueError, OSError):
            continue
        for iv in plan.interventions:
            cited[iv.id] = [s for s in iv.sources if s.startswith("sk-")]
    return cited


def _skills(path: Path, ids: set[str]) -> dict[str, SkillCite]:
    """What the run's skill store says now of each cited skill; `unknown` where it cannot say."""
    from evotrainer.memory.store import SkillStore
    from evotrainer.workspaces.run import RunWorkspace

    out = {i: SkillCite(id=i, outcome="unknown") for i in ids}
    if not ids:
        return out
    try:
        cfg = RunWorkspace.open(path).config()
        store = SkillStore(cfg.skills) if cfg.skills else SkillStore()
        if not store.path.is_dir():
            return out
        for i in ids:
            try:
                sk = store.get(i)
            except (UserError, KeyError):
                continue
            out[i] = SkillCite(id=i, outcome=sk.outcome, effect=sk.effect, transform=sk.transform,
                               domains=sorted({v.domain for v in sk.validations}))
    except (UserError, OSError, ValueError, ValidationError):
        pass
    return out


def read_facts(run: str | Path, rep: RunReport | None = None) -> RunFacts:
    """One run's candidates as the analyses read them (`rep`: the run already read by `report.read_run`)."""
    rep = rep or read_run(run)
    path = Path(run)
    cited = _plans(path)
    skills = _skills(path, {s for ids in cited.values() for s in ids})
    born = {h.revised: h.generation for h in (rep.summary.history if rep.summary else []) if h.revised}
    facts = []
    for r in rep.lineage:
        v, bt = rep.verdicts.get(r.branch), rep.backtests.get(r.branch)
        sr = bt.short_run if bt else None
        iv_id = (v.intervention.id if v and v.intervention else r.intervention_id)
        facts.append(CandidateFact(
            run=rep.name, domain=rep.domain, generation=r.generation, branch=r.branch, factor=r.factor,
            transform=v.transform if v else None, status=status_of(r, v),
            effect=v.effect if v and v.effect is not None else r.effect, p_gain=v.p_gain if v else None,
            failed_gates=(v.failed_gates if v else []) or (bt.failed_gates if bt else []),
            train_reward_delta=sr.train_reward_delta if sr else None,
            train_correct_delta=sr.train_correct_delta if sr else None,
            skills=[skills[s] for s in cited.get(iv_id, [])],
            prior=v.prior if v and v.prior and not v.prior.startswith(UNMEASURED) else ""))
    return RunFacts(run=rep.name, path=str(path), domain=rep.domain, candidates=facts, born=born)


NOT_YET = "(not committed yet)"


def change_of(c: CandidateFact) -> str:
    """What a candidate changed: its catalog transform, else its factor."""
    return c.transform or c.factor or NOT_YET


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.3f}"


def _gate_origin(gate: str, run: RunFacts) -> str:
    analyzer = gate.split("/", 1)[0].split(":", 1)[0]
    return f"evolved, born g{run.born[analyzer]}" if analyzer in run.born else "built-in"


# -- the three analyses: each a titled list of tables (header, rows) with words around them -------------------
class Table(BaseModel):
    header: list[str]
    rows: list[list[str]]
    empty: str = ""  # said instead of the table when it has no row


class Section(BaseModel):
    title: str
    intro: str
    tables: list[Table]
    notes: list[str] = []

    def markdown(self) -> str:
        out = [f"## {self.title}", "", self.intro, ""]
        for t in self.tables:
            if not t.rows:
                out += [t.empty, ""]
                continue
            out += ["| " + " | ".join(t.header) + " |", "|" + "---|" * len(t.header)]
            out += ["| " + " | ".join(r) + " |" for r in t.rows] + [""]
        return "\n".join(out + [n for n in self.notes for n in (n, "")])

    def html(self) -> str:
        from html import escape

        def cell(text: str) -> str:  # the Markdown code spans, as code
            parts = escape(text).split("`")
            return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))

        out = [f"<h3>{escape(self.title)}</h3><p>{cell(self.intro)}</p>"]
        for t in self.tables:
            if not t.rows:
                out.append(f'<p class="missing">{escape(t.empty)}</p>')
                continue
            out.append("<table><tr>" + "".join(f"<th>{escape(h)}</th>" for h in t.header) + "</tr>"
                       + "".join("<tr>" + "".join(f"<td>{cell(c)}</td>" for c in r) + "</tr>" for r in t.rows)
                       + "</table>")
        return "".join(out + [f"<p>{cell(n)}</p>" for n in self.notes])


def retained(a: Analysis) -> Section:
    rows = []
    by_domain: dict[str, list[CandidateFact]] = defaultdict(list)
    for c in a.candidates():
        by_domain[c.domain].append(c)
    for domain in sorted(by_domain):
        groups: dict[str, list[CandidateFact]] = defaultdict(list)
        for c in by_domain[domain]:
            groups[change_of(c)].append(c)
        for k in sorted(groups, key=lambda k: (-sum(c.status == "promoted" for c in groups[k]), -len(groups[k]), k)):
            cs = groups[k]
            won = sorted((c for c in cs if c.status == "promoted"), key=lambda c: c.generation)
            eff = [c.effect for c in cs if c.effect is not None]
            rows.append([domain, f"`{k}`" if k != NOT_YET else k, str(len(cs)), str(len(won)),
                         ", ".join(f"g{c.generation}" for c in won) or "-", _f(sum(eff) / len(eff) if eff else None)])
    return Section(title="1. Retained strategies",
                   intro="What each domain kept: per change, the candidates that tested it, how many were promoted and "
                         "in which generations.",
                   tables=[Table(header=["domain", "change", "tested", "promoted", "generations promoted",
                                         "mean dev effect"], rows=rows, empty="No candidate in these runs yet.")])


def blocked(a: Analysis) -> Section:
    rows = [[r.run, f"`{c.branch}`", "; ".join(f"`{g}` ({_gate_origin(g, r)})" for g in c.failed_gates),
             _f(c.train_reward_delta), _f(c.train_correct_delta), _f(c.effect)]
            for r in a.runs for c in r.candidates if c.status == "gate"]
    evolved = [f"`{k}` ({r.run}, g{g})" for r in a.runs for k, g in r.born.items()]
    return Section(title="2. Invalid branches blocked",
                   intro="Every candidate a gate rejected: the gate, where it came from (built in, or written by "
                         "diagnostics revision in the generation named), its train reward and train correct rate "
                         "against its control arm, and its sealed dev effect. A reward that rose with no rise in dev "
                         "is the signature of a hack.",
                   tables=[Table(header=["run", "candidate", "gate (origin)", "train reward vs control",
                                         "train correct vs control", "sealed dev effect"], rows=rows,
                                 empty="No candidate in these runs failed a gate.")],
                   notes=["Analyzers written by diagnostics revision: " + (", ".join(evolved) or "none") + "."])


def first_promotion(run: RunFacts) -> int | None:
    """Candidates tried up to and including the first promoted one (None: nothing promoted)."""
    for i, c in enumerate(sorted(run.candidates, key=lambda c: c.generation)):
        if c.status == "promoted":
            return i + 1
    return None


def shaped(a: Analysis) -> Section:
    chains = [[c.run, f"`{c.branch}`", f"`{s.id}`", f"{s.outcome} {_f(s.effect)}", ", ".join(s.domains) or "?",
               "yes" if s.domains and c.domain not in s.domains else "no", f"{c.status} {_f(c.effect)}"]
              for c in a.candidates() for s in c.skills]
    priors = [[c.run, f"`{c.branch}`", change_of(c), c.prior, _f(c.p_gain).lstrip("+"), f"{c.status} {_f(c.effect)}"]
              for c in a.candidates() if c.prior]
    per_run = [[r.run, r.domain, str(len(r.candidates)), str(sum(bool(c.skills) for c in r.candidates)),
                str(sum(bool(c.prior) for c in r.candidates)), str(sum(c.status == "promoted" for c in r.candidates)),
                str(first_promotion(r) or "none promoted")] for r in a.runs]
    return Section(title="3. Skills shaping search",
                   intro="Each candidate whose plan cited a retrieved skill: what the skill said (its outcome and "
                         "effect now, the domains it was learned in) and what the candidate did; cross-domain: a skill "
                         "learned only in domains other than the run's. Retrieval hands a plan skills of the run's "
                         "domain and general ones; memory also reaches a candidate as the prior it is ranked and "
                         "judged under, every measurement of its change in any run and domain (those of other domains "
                         "as weaker evidence): each candidate judged under such a prior, with it. Then per run: "
                         "candidates, those a skill informed, those judged under memory's prior, promotions, and the "
                         "candidates tried up to the first promotion.",
                   tables=[Table(header=["run", "candidate", "skill", "skill said", "learned in", "cross-domain",
                                         "candidate's outcome"], rows=chains,
                                 empty="No plan in these runs cited a skill (empty stores, or nothing retrieved was "
                                       "relevant)."),
                           Table(header=["run", "candidate", "change", "prior: what memory had measured of it",
                                         "P(gain)", "candidate's outcome"], rows=priors,
                                 empty="No candidate was judged under a prior from memory (nothing measured of its "
                                       "change before)."),
                           Table(header=["run", "domain", "candidates", "informed by a skill", "under memory's prior",
                                         "promoted", "candidates to the first promotion"], rows=per_run)])


def sections(a: Analysis) -> list[Section]:
    return [retained(a), blocked(a), shaped(a)]


# -- figures -------------------------------------------------------------------------------------------------------
STATUS_COLOR = {"promoted": "#2a8a3a", "gate": "#8b1a1a", "rejected": "#d04a3a", "inconclusive": "#3a6ad0",
                "open": "#c89a00"}


def _plots(a: Analysis, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    cands = a.candidates()
    # 1: per domain and change, candidates by status
    keys = sorted({(c.domain, change_of(c)) for c in cands})
    fig, ax = plt.subplots(figsize=(7, 0.35 * max(len(keys), 3) + 1.2))
    left = [0.0] * len(keys)
    for st, color in STATUS_COLOR.items():
        n = [sum(1 for c in cands if (c.domain, change_of(c)) == k and c.status == st) for k in keys]
        if any(n):
            ax.barh(range(len(keys)), n, left=left, color=color, label=st)
            left = [x + y for x, y in zip(left, n)]
    ax.set_yticks(range(len(keys)), [f"{d}: {k}" for d, k in keys], fontsize=8)
    ax.set_xlabel("candidates")
    ax.set_title("retained strategies: candidates per change, by outcome")
    if keys:
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(out / "retained.png", dpi=110)
    plt.close(fig)
    names.append("retained.png")
    # 2: train reward against sealed dev, by outcome
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for st, color in STATUS_COLOR.items():
        pts = [(c.train_reward_delta, c.effect) for c in cands
               if c.status == st and c.train_reward_delta is not None and c.effect is not None]
        if pts:
            ax.scatter(*zip(*pts), color=color, label=st, s=30, marker="x" if st == "gate" else "o")
    ax.axhline(0, color="#999", lw=0.8)
    ax.axvline(0, color="#999", lw=0.8)
    ax.set_xlabel("train reward, candidate minus control")
    ax.set_ylabel("sealed dev accuracy, candidate minus control")
    ax.set_title("branches: what training saw against what sealed dev saw")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "blocked.png", dpi=110)
    plt.close(fig)
    names.append("blocked.png")
    # 3: outcomes of candidates with a cited skill, with memory's prior only, with neither
    fig, ax = plt.subplots(figsize=(6, 3.2))
    groups = {"informed by a skill": [c for c in cands if c.skills],
              "memory's prior only": [c for c in cands if c.prior and not c.skills],
              "neither": [c for c in cands if not (c.skills or c.prior)]}
    left = [0.0] * len(groups)
    for st, color in STATUS_COLOR.items():
        n = [sum(c.status == st for c in g) for g in groups.values()]
        if any(n):
            ax.barh(range(len(groups)), n, left=left, color=color, label=st)
            left = [x + y for x, y in zip(left, n)]
    ax.set_yticks(range(len(groups)), list(groups))
    ax.set_xlabel("candidates")
    ax.set_title("skills shaping search: outcomes of candidates")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(out / "skills.png", dpi=110)
    plt.close(fig)
    names.append("skills.png")
    return names


def analyze(runs: list[str | Path], out: str | Path) -> Path:
    """Read every run, write `OUT/analysis.md` (+ `analysis.json`, three PNGs); returns the Markdown's path."""
    if not runs:
        raise UserError("analyze needs at least one run directory")
    a = Analysis(runs=[read_facts(r) for r in runs])
    if len({r.run for r in a.runs}) < len(a.runs):  # compare's runs are named by arm and seed: name their comparison
        for r in a.runs:
            p = Path(r.path).resolve()
            r.run = f"{(p.parent.parent if p.parent.name == 'runs' else p.parent).name}/{p.name}"
            for c in r.candidates:
                c.run = r.run
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        figs = _plots(a, out)
    except OSError as e:
        raise UserError(f"cannot write the analysis to {out} ({e.strerror}): choose another --out") from e
    domains = Counter(r.domain for r in a.runs)
    head = ["# EvoTrainer: trajectory analyses", "",
            f"{len(a.runs)} runs ({', '.join(f'{n} {d}' for d, n in sorted(domains.items()))}), "
            f"{len(a.candidates())} candidates: {', '.join(f'`{r.path}`' for r in a.runs)}.", ""]
    body = [part for sec, fig in zip(sections(a), figs) for part in (sec.markdown(), f"![{sec.title}]({fig})", "")]
    md = out / "analysis.md"
    atomic_write_text(out / "analysis.json", json.dumps(a.model_dump(), indent=1))
    atomic_write_text(md, "\n".join(head + body))
    return md
