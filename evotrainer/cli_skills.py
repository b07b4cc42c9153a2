"""`evotrainer skills ...`: browse, query, export and import the skill memory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(no_args_is_help=True, help="Skill memory: distilled lessons shared across runs.")

SkillsOpt = Annotated[Path | None, typer.Option("--skills", help="the store (default $EVOTRAINER_SKILLS or "
                                                                   "~/.evotrainer/skills)")]
EmbeddingOpt = Annotated[str | None, typer.Option(help="minilm or hashing; default: the store's own (minilm for a "
                                                       "new store)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON")]


def _store(path: Path | None, embedding: str | None = None):
    from evotrainer.memory.store import SkillStore

    return SkillStore(path, embedding)


def _table(rows: list, scores: list[float] | None = None) -> Table:
    table = Table(show_lines=False)
    for col in ["id", *(["score"] if scores is not None else []), "outcome", "factor", "effect", "domains", "trigger"]:
        table.add_column(col, overflow="fold")
    for i, s in enumerate(rows):
        eff = "" if s.effect is None else f"{s.effect:+.3f}"
        doms = ",".join(s.domains) + (" (general)" if s.general else "")
        table.add_row(s.id, *([f"{scores[i]:.3f}"] if scores is not None else []), s.outcome, s.factor, eff, doms,
                      s.trigger.text)
    return table


@app.command("list")
def list_(
    domain: Annotated[str | None, typer.Option(help="only skills that held in this domain (or are general)")] = None,
    outcome: Annotated[str | None, typer.Option(help="positive or negative")] = None,
    factor: Annotated[str | None, typer.Option(help="only this factor, e.g. recipe.temperature")] = None,
    skills: SkillsOpt = None, embedding: EmbeddingOpt = None, as_json: JsonOpt = False,
) -> None:
    """Every skill, most recently updated first."""
    if outcome not in (None, "positive", "negative"):
        raise typer.BadParameter("--outcome is positive or negative")
    store = _store(skills, embedding)
    rows = store.list(domain, outcome, factor)
    if as_json:
        print(json.dumps([s.model_dump() for s in rows], indent=1))
        return
    if not rows:
        Console().print(f"no skills in {store.path}")
        return
    Console().print(_table(rows))


@app.command()
def query(
    text: Annotated[str, typer.Argument(help="a diagnosis, in words")],
    k: Annotated[int, typer.Option(min=1, help="how many skills")] = 5,
    domain: Annotated[str | None, typer.Option(help="only skills from this domain (or general ones)")] = None,
    outcome: Annotated[str | None, typer.Option(help="positive or negative")] = None,
    analyzer: Annotated[list[str] | None, typer.Option(help="an analyzer id the diagnosis rests on (repeatable); "
                                                            "reranks by signature")] = None,
    skills: SkillsOpt = None, embedding: EmbeddingOpt = None, as_json: JsonOpt = False,
) -> None:
    """The skills closest to a diagnosis, with scores (browsing does not count as a retrieval)."""
    store = _store(skills, embedding)
    hits = store.query(text, k, domain, outcome, analyzers=analyzer or None, record=False)
    if as_json:
        print(json.dumps([h.model_dump() for h in hits], indent=1))
        return
    if not hits:
        Console().print(f"no skills in {store.path}")
        return
    Console().print(_table([h.skill for h in hits], [h.score for h in hits]))


@app.command()
def show(
    skill_id: Annotated[str, typer.Argument(help="a skill id, from `skills list`")],
    skills: SkillsOpt = None, embedding: EmbeddingOpt = None, as_json: JsonOpt = False,
) -> None:
    """One skill: trigger, intervention, lesson, every backtest behind it, counters."""
    s = _store(skills, embedding).get(skill_id)
    if as_json:
        print(s.model_dump_json(indent=1))
        return
    con = Console()
    eff = "n/a" if s.effect is None else f"{s.effect:+.3f}" + (
        f" [{s.ci_low:+.3f}, {s.ci_high:+.3f}]" if s.ci_low is not None else "")
    con.print(f"[bold]{s.id}[/bold]  {s.outcome}  factor [cyan]{s.factor}[/cyan]"
              + (f"  transform {s.transform}" if s.transform else ""), highlight=False)
    con.print(f"trigger:  {s.trigger.text}\n          analyzers {', '.join(s.trigger.analyzers) or '-'}"
              f"{'; ' + s.trigger.signature if s.trigger.signature else ''}", highlight=False)
    con.print(f"change:   {s.intervention}\nexpected: {s.expected or '-'}\nlesson:   {s.lesson or '-'}",
              highlight=False)
    con.print(f"effect:   {eff}; domains {', '.join(s.domains) or '-'}{' (general)' if s.general else ''}",
              highlight=False)
    con.print(f"counters: retrieved {s.retrieved}, used {s.used}, outcomes after use "
              f"{', '.join(s.outcomes_after_use) or '-'}; created {s.created}, updated {s.updated}", highlight=False)
    table = Table(title="backtests")
    for col in ["domain", "run", "gen", "branch", "commit", "verdict", "effect", "95% CI", "seeds x steps", "gates"]:
        table.add_column(col)
    for v in s.validations:
        table.add_row(v.domain, v.run, str(v.generation), v.branch, v.commit[:8], v.verdict,
                      "" if v.effect is None else f"{v.effect:+.3f}",
                      "" if v.ci_low is None else f"[{v.ci_low:+.3f}, {v.ci_high:+.3f}]", f"{v.seeds} x {v.steps}",
                      ", ".join(v.failed_gates))
    con.print(table)


@app.command("export")
def export(
    file: Annotated[Path, typer.Argument(help="a .jsonl file to write")],
    skills: SkillsOpt = None, embedding: EmbeddingOpt = None,
) -> None:
    """Every skill as one JSON line, every field included."""
    store = _store(skills, embedding)
    n = store.export(file)
    Console().print(f"exported {n} skills from {store.path} to {file}")


@app.command("import")
def import_(
    file: Annotated[Path, typer.Argument(help="a .jsonl file written by `skills export`")],
    skills: SkillsOpt = None, embedding: EmbeddingOpt = None,
) -> None:
    """Add the skills of an export; ids already in the store are kept as they are."""
    store = _store(skills, embedding)
    added, skipped = store.import_(file)
    Console().print(f"imported {added} skills into {store.path} ({store.embedding} embedding)"
                    + (f"; {skipped} already present, kept" if skipped else ""))
