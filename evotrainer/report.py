"""`evotrainer report RUN`: one self-contained HTML page of a run, finished or still in progress.

Everything is read through the models the run is written with (the harness repository's lineage, `VerdictRecord`,
`BacktestResult`, `HealthReport`, `RunSummary`, `events.jsonl`); a file not written yet is named as missing, never an
error. The page needs no server and no network: inline CSS and SVG, `<details>` for click-to-expand, no script.
"""

from __future__ import annotations

import re
from collections import defaultdict
from html import escape
from pathlib import Path

from pydantic import BaseModel, ValidationError

from evotrainer.agents.schemas import VerdictRecord
from evotrainer.base.errors import UserError
from evotrainer.base.files import atomic_write_text
from evotrainer.graph.build import RunSummary
from evotrainer.graph.events import EventLog
from evotrainer.trainer.backtest.results import BacktestResult
from evotrainer.trainer.diagnostics.report import HealthReport
from evotrainer.trainer.evaluate import EvalResult
from evotrainer.trainer.evidence import branch_dir
from evotrainer.workspaces.repo import BranchRecord
from evotrainer.workspaces.run import RunWorkspace

SEVERITIES = ("info", "warning", "critical")
STATUS_LABEL = {"promoted": "promoted", "gate": "rejected by a gate", "rejected": "rejected",
                "inconclusive": "inconclusive", "open": "open (not judged yet)"}

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
code,pre{font:12px/1.4 ui-monospace,monospace}pre{background:#f7f7f7;padding:.6em;overflow-x:auto}
.missing{color:#888;font-style:italic}table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ddd;padding:.25em .5em;text-align:left;vertical-align:top}
ul.tree,ul.tree ul{list-style:none;padding-left:1.4em;margin:0}ul.tree li{border-left:2px solid #ccc;
padding:.2em 0 .2em .8em;margin-left:-.2em}summary{cursor:pointer}
.badge{display:inline-block;border-radius:3px;padding:0 .4em;font-size:12px;color:#fff}
.promoted{background:#2a8a3a}.gate{background:#8b1a1a}.rejected{background:#d04a3a}.inconclusive{background:#3a6ad0}
.open{background:#c89a00}.add{color:#1a7a2a;background:#eefbee}.del{color:#a01a1a;background:#fdeeee}
.hunk{color:#6a3ab0}.sev-info{background:#dbe8f7}.sev-warning{background:#f7dca0}.sev-critical{background:#f0a0a0}
.sev-none{background:#fff}.cell{text-align:center;min-width:5em}
.tk{color:#7a2aa0;font-weight:600}.ts{color:#a05a00}.tc{color:#6a737d;font-style:italic}.tn{color:#005cc5}
.tb{color:#005cc5}
"""


class RunReport(BaseModel):
    """What the page shows, read from the run directory (None or empty: not written yet)."""

    name: str
    path: str
    domain: str
    summary: RunSummary | None
    lineage: list[BranchRecord]
    verdicts: dict[str, VerdictRecord]
    backtests: dict[str, BacktestResult]
    diffs: dict[str, str]
    dev: dict[int, float]  # sealed dev accuracy of the champion at each generation's end
    dev_start: float | None
    health: list[HealthReport]
    rollouts: dict[str, dict] = {}  # rollout id -> the row, for the rollouts a candidate's findings cite
    events: list[dict]
    unreadable: list[str]  # files present but not readable as their model


def _load(model: type[BaseModel], path: Path, unreadable: list[str]):
    if not path.is_file():
        return None
    try:
        return model.model_validate_json(path.read_text())
    except (ValidationError, ValueError, OSError) as e:
        unreadable.append(f"{path.name}: {str(e).splitlines()[0]}")
        return None


def read_run(run: str | Path) -> RunReport:
    """Read everything the page shows; a missing file is simply absent from the result."""
    ws = RunWorkspace.open(run)
    reports, bad = ws.path / "reports", []
    repo = ws.harness
    lineage = repo.lineage()
    verdicts, backtests, diffs = {}, {}, {}
    for r in lineage:
        if v := _load(VerdictRecord, ws.verdict_path(r.branch), bad):
            verdicts[r.branch] = v
        if b := _load(BacktestResult, reports / f"backtest-{branch_dir(r.branch)}.json", bad):
            backtests[r.branch] = b
        try:
            diffs[r.branch] = repo.diff_commits(r.parent, r.head)
        except UserError as e:
            diffs[r.branch] = f"(no diff: {e})"
    summary = _load(RunSummary, reports / "summary.json", bad)
    dev: dict[int, float] = {}
    if summary:
        dev = {h.generation: h.dev_accuracy if h.dev_accuracy is not None else h.dev_trained
               for h in summary.history if h.dev_accuracy is not None or h.dev_trained is not None}
    for path in sorted(ws.path.glob("checkpoints/g*-train/specs/eval-*-dev-*.result.json")):  # a run in progress
        m = re.fullmatch(r"g(\d+)-train", path.parts[-3])
        if m and int(m.group(1)) not in dev and (e := _load(EvalResult, path, bad)):
            dev[int(m.group(1))] = e.accuracy
    dev_start = summary.dev_start if summary else None
    if dev_start is None:  # in progress: the starting policy's evaluation, written beside training's first segment
        starts = [e for p in sorted((ws.path / "specs").glob("eval-*-dev-*.result.json"))
                  if (e := _load(EvalResult, p, bad))]
        dev_start = starts[0].accuracy if len(starts) == 1 else None
    health = [h for p in sorted(reports.glob("health-g*-*.json")) if (h := _load(HealthReport, p, bad))]
    rollouts = cited_rollouts(ws.path / "evidence", backtests, bad)
    health.sort(key=lambda h: (h.generation if h.generation is not None else -1, h.branch or ""))
    return RunReport(name=ws.path.name, path=str(ws.path), domain=ws.config().domain, summary=summary, lineage=lineage,
                     verdicts=verdicts, backtests=backtests, diffs=diffs, dev=dict(sorted(dev.items())),
                     dev_start=dev_start, health=health, rollouts=rollouts,
                     events=EventLog(ws.path / "events.jsonl").read(), unreadable=bad)


CITED = 3  # rollouts shown per finding
TEXT = 1500  # characters of a prompt or completion shown


def cited_rollouts(evidence: Path, backtests: dict[str, BacktestResult], bad: list[str]) -> dict[str, dict]:
    """The rows of the first rollouts each candidate's own findings cite (its short run's evidence)."""
    from evotrainer.trainer.evidence import read_rollouts

    out: dict[str, dict] = {}
    for branch, bt in backtests.items():
        ids = {i for f in (bt.short_run.findings if bt.short_run else []) if f.severity != "info"
               for i in f.evidence[:CITED]}
        if not ids or not evidence.is_dir():
            continue
        try:
            table = read_rollouts(evidence, generation=bt.generation, branch=branch)
        except UserError as e:
            bad.append(str(e))
            continue
        cols = [c for c in ("rollout_id", "prompt", "completion", "reward", "correct") if c in table.column_names]
        for row in table.select(cols).to_pylist():
            if row["rollout_id"] in ids:
                out[row["rollout_id"]] = row
    return out


def _rollout(rid: str, row: dict | None) -> str:
    if row is None:
        return f"<li><code>{escape(rid)}</code> <i>(not in the evidence kept)</i></li>"
    head = f"reward {row.get('reward', float('nan')):.3f}, correct {row.get('correct')}"
    return (f"<li><details><summary><code>{escape(rid)}</code>: {escape(head)}</summary><p>prompt:</p><pre>"
            f"{escape(str(row.get('prompt', ''))[:TEXT])}</pre><p>completion:</p><pre>"
            f"{escape(str(row.get('completion', ''))[:TEXT])}</pre></details></li>")


def findings_html(rep: RunReport, bt: BacktestResult | None) -> str:
    """The candidate's own findings (its short run's evidence), each with the first rollouts it cites."""
    found = [f for f in (bt.short_run.findings if bt and bt.short_run else []) if f.severity != "info"]
    if not found:
        return ""
    items = "".join(f"<li>{escape(f.severity)} <code>{escape(f.analyzer)}</code> {escape(f.metric)} = {f.value:.3f}"
                    f"{' GATE' if f.gate else ''}: {escape(f.message)}<ul>"
                    + "".join(_rollout(i, rep.rollouts.get(i)) for i in f.evidence[:CITED]) + "</ul></li>"
                    for f in found)
    return f"<p><b>Its own evidence:</b></p><ul>{items}</ul>"


def status_of(r: BranchRecord, verdict: VerdictRecord | None) -> str:
    """promoted, gate (rejected by a failed gate), rejected, inconclusive or open."""
    if r.status == "rejected" and verdict and verdict.failed_gates:
        return "gate"
    return r.status


def _f(x: float | None, sign: bool = False) -> str:
    return "n/a" if x is None else f"{x:+.3f}" if sign else f"{x:.3f}"


def _missing(text: str) -> str:
    return f'<p class="missing">{escape(text)}</p>'


# the tokens coloured in a diff's lines, by the file's kind (a harness holds Python and YAML); strings come first, so
# that a `#` inside one is not a comment
_KEYWORDS = (r"\b(?:False|None|True|and|as|assert|async|await|break|class|continue|def|del|elif|else|except|finally|"
             r"for|from|global|if|import|in|is|lambda|nonlocal|not|or|pass|raise|return|try|while|with|yield)\b")
_STRING = r"""'(?:[^'\\]|\\.)*'?|"(?:[^"\\]|\\.)*"?"""
_NUMBER = r"\b\d+(?:\.\d+)?(?:[eE][+-]?\d+)?\b"
_TOKENS = {
    "py": re.compile(rf"(?P<s>{_STRING})|(?P<c>#.*)|(?P<k>{_KEYWORDS})|(?P<n>{_NUMBER})"),
    "yaml": re.compile(rf"(?P<s>{_STRING})|(?P<c>(?<![^\s])#.*)|(?P<k>^[\w.-]+(?=:))|(?P<n>{_NUMBER})"
                       r"|(?P<b>\b(?:true|false|null)\b)"),
}


def _highlight(code: str, kind: str | None) -> str:
    """One line of a harness file, escaped, its strings, comments, keywords (YAML: keys) and numbers in spans."""
    pattern = _TOKENS.get(kind or "")
    if pattern is None:
        return escape(code)
    indent = len(re.match(r"(?:\s|- )*" if kind == "yaml" else r"\s*", code).group())  # a YAML list's dash too
    out, at, code = [escape(code[:indent])], 0, code[indent:]
    for m in pattern.finditer(code):
        out.append(escape(code[at:m.start()]))
        out.append(f'<span class="t{m.lastgroup}">{escape(m.group())}</span>')
        at = m.end()
    return "".join(out) + escape(code[at:])


def diff_html(diff: str) -> str:
    """A unified diff, escaped, its added and removed lines coloured and the code in them highlighted."""
    if not diff.strip():
        return _missing("no changes against its parent")
    out, kind = [], None
    for line in diff.splitlines():
        if line.startswith(("+++", "---")):
            name = line[4:].strip()
            kind = "py" if name.endswith(".py") else "yaml" if name.endswith((".yaml", ".yml")) else None
            out.append(escape(line))
        elif line.startswith("@@"):
            out.append(f'<span class="hunk">{escape(line)}</span>')
        elif line.startswith(("+", "-", " ")):
            cls = {"+": "add", "-": "del", " ": ""}[line[0]]
            body = escape(line[0]) + _highlight(line[1:], kind)
            out.append(f'<span class="{cls}">{body}</span>' if cls else body)
        else:
            out.append(escape(line))
    return '<pre class="diff">' + "\n".join(out) + "</pre>"


def _candidate(rep: RunReport, r: BranchRecord) -> str:
    v, bt = rep.verdicts.get(r.branch), rep.backtests.get(r.branch)
    st = status_of(r, v)
    effect = "" if r.effect is None else f" {r.effect:+.3f}"
    parts = [f'<details class="candidate" id="{escape(r.branch)}"><summary><span class="badge {st}">'
             f"{STATUS_LABEL[st]}</span> <code>{escape(r.branch)}</code> {escape(r.factor)}{effect}</summary>",
             f"<p><b>Hypothesis:</b> {escape(r.hypothesis) or '<i>none recorded</i>'}</p>",
             f"<p>head <code>{r.head[:8]}</code>, parent <code>{r.parent[:8]}</code></p>"]
    if bt is None:
        parts.append(_missing("no backtest report yet"))
    elif bt.short_run is None:
        parts.append(f"<p><b>Backtest:</b> replay only; failed gates: {escape(', '.join(bt.failed_gates) or 'none')}"
                     "</p>")
    else:
        s = bt.short_run
        parts.append(f"<p><b>Backtest:</b> dev {s.delta:+.3f} [{s.ci_low:+.3f}, {s.ci_high:+.3f}] (95% interval), "
                     f"MDE {s.mde:.3f}, {len(s.seeds)} seeds x {s.steps} steps on {s.dev_items} dev items, stopped: "
                     f"{escape(s.stopped)}; failed gates: {escape(', '.join(bt.failed_gates) or 'none')}</p>")
    if v is None:
        parts.append(_missing("no verdict yet"))
    else:
        reasons = "".join(f"<li>{escape(x)}</li>" for x in v.reasons)
        gates = f"; failed gates: {escape(', '.join(v.failed_gates))}" if v.failed_gates else ""
        parts.append(f"<p><b>Verdict:</b> {escape(v.decision)} by {escape(v.author or 'unknown')}{gates}</p>"
                     f"<ul>{reasons}</ul>" + (f"<p><b>Lesson:</b> {escape(v.lesson)}</p>" if v.lesson else ""))
    parts.append("<p><b>Diff against its parent:</b></p>" + diff_html(rep.diffs.get(r.branch, "")))
    parts.append(findings_html(rep, bt))
    return "".join(parts) + "</details>"


def lineage_html(rep: RunReport) -> str:
    """The lineage as a tree: each generation under the champion commit its candidates branched from."""
    if not rep.lineage:
        return _missing("no candidate branches yet (the loop has not reached implement)")
    by_gen: dict[int, dict[str, list[BranchRecord]]] = defaultdict(lambda: defaultdict(list))
    for r in rep.lineage:
        by_gen[r.generation][r.parent].append(r)
    items = []
    for g, parents in sorted(by_gen.items()):
        for parent, cands in parents.items():
            promoted = [c.branch for c in cands if c.status == "promoted"]
            tail = f" -> promoted {', '.join(promoted)}" if promoted else ""
            kids = "".join(f"<li>{_candidate(rep, c)}</li>" for c in cands)
            items.append(f"<li><b>generation {g}</b>: champion <code>{parent[:8]}</code>, {len(cands)} candidates"
                         f"{escape(tail)}<ul>{kids}</ul></li>")
    return f'<ul class="tree">{"".join(items)}</ul>'


def dev_chart(rep: RunReport) -> str:
    """Sealed dev accuracy of the champion per generation, as an inline SVG line chart."""
    points = ([(0, rep.dev_start, "dev-start")] if rep.dev_start is not None else []) + \
        [(g, d, "dev-point") for g, d in rep.dev.items()]
    if not rep.dev:
        return _missing("no generation has been evaluated on sealed dev yet")
    w, h, pad = 560, 240, 44
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1 = min(xs), max(max(xs), min(xs) + 1)
    y0, y1 = min(ys) - 0.02, max(ys) + 0.02

    def px(x: float) -> float:
        return pad + (x - x0) / (x1 - x0) * (w - 2 * pad)

    def py(y: float) -> float:
        return h - pad - (y - y0) / (y1 - y0) * (h - 2 * pad)

    line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y, _ in points)
    dots = "".join(f'<circle class="{c}" cx="{px(x):.1f}" cy="{py(y):.1f}" r="4" fill="#2a5ad0"><title>'
                   f'{"start" if c == "dev-start" else f"generation {x}"}: {y:.3f}</title></circle>'
                   f'<text x="{px(x):.1f}" y="{py(y) - 8:.1f}" font-size="11" text-anchor="middle">{y:.3f}</text>'
                   for x, y, c in points)
    ticks = "".join(f'<text x="{px(x):.1f}" y="{h - pad + 16}" font-size="11" text-anchor="middle">'
                    f'{"start" if c == "dev-start" else f"g{x}"}</text>' for x, _, c in points)
    axes = (f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="#999"/>'
            f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="#999"/>'
            f'<text x="{pad - 4}" y="{py(y1):.1f}" font-size="11" text-anchor="end">{y1:.2f}</text>'
            f'<text x="{pad - 4}" y="{py(y0):.1f}" font-size="11" text-anchor="end">{y0:.2f}</text>')
    return (f'<svg width="{w}" height="{h}" role="img" '
            f'aria-label="sealed dev accuracy per generation">{axes}<polyline points="{line}" fill="none" '
            f'stroke="#2a5ad0" stroke-width="2"/>{dots}{ticks}</svg>')


def health_table(rep: RunReport) -> str:
    """Analyzers x health reports, each cell the worst severity that analyzer reported there."""
    if not rep.health:
        return _missing("no health report yet (written when a generation's evidence is diagnosed)")
    cols = [f"g{h.generation if h.generation is not None else 'all'} {h.branch or 'all'}" for h in rep.health]
    worst: dict[str, dict[int, tuple[int, str]]] = defaultdict(dict)
    for i, h in enumerate(rep.health):
        for f in h.findings:
            rank = SEVERITIES.index(f.severity)
            note = f"{f.metric} = {f.value:.3f}" + (" GATE" if f.gate else "")
            if i not in worst[f.analyzer] or rank > worst[f.analyzer][i][0]:
                worst[f.analyzer][i] = (rank, note)
    head = "<tr><th>analyzer (columns: evidence of generation, branch)</th>" + \
        "".join(f"<th>{escape(c)}</th>" for c in cols) + "</tr>"
    rows = []
    for analyzer in sorted(worst):
        cells = []
        for i in range(len(rep.health)):
            if i in worst[analyzer]:
                rank, note = worst[analyzer][i]
                cells.append(f'<td class="cell sev-{SEVERITIES[rank]}" title="{escape(note)}">{SEVERITIES[rank]}'
                             "</td>")
            else:
                cells.append('<td class="cell sev-none">-</td>')
        rows.append(f"<tr><td><code>{escape(analyzer)}</code></td>{''.join(cells)}</tr>")
    if not rows:
        rows.append(f'<tr><td colspan="{len(cols) + 1}">no analyzer fired</td></tr>')
    return f"<table>{head}{''.join(rows)}</table>"


def skills_table(rep: RunReport) -> str:
    rows = [e for e in rep.events if e.get("event") == "distill"]
    if not rows:
        return _missing("no skill distilled yet")
    body = "".join(f"<tr><td>{e.get('generation', '')}</td><td><code>{escape(str(e.get('skill') or '-'))}</code></td>"
                   f"<td>{escape(str(e.get('outcome') or ''))}</td><td>{escape(str(e.get('factor') or ''))}</td>"
                   f"<td>{'merged' if e.get('merged') else 'new' if e.get('skill') else 'skipped'}</td>"
                   f"<td>{escape(str(e.get('skipped') or e.get('branch') or ''))}</td></tr>" for e in rows)
    return ("<table><tr><th>gen</th><th>skill</th><th>outcome</th><th>factor</th><th>store</th><th>note</th></tr>"
            f"{body}</table>")


def cost_html(rep: RunReport) -> str:
    """Totals (from summary.json once the run ends, else summed from events.jsonl) and seconds per node."""
    ends = [e for e in rep.events if e.get("event") == "end"]
    calls = [e for e in rep.events if e.get("event") == "call"]
    tokens = sum(int(e.get("prompt_tokens") or 0) + int(e.get("completion_tokens") or 0) for e in calls)
    s = rep.summary
    if s:
        total = (f"<p>{s.steps_used} GRPO steps, {s.seconds_used:.0f} s, ${s.llm_dollars:.2f} meta-LLM "
                 f"({tokens} tokens in {len(calls)} calls); {s.candidates} candidates, {len(s.promoted)} promoted, "
                 f"{s.skills} skills in memory. {'Finished' if s.finished else 'Stopped'}: {escape(s.stop_reason)}."
                 "</p>")
    else:
        secs = sum(float(e.get("seconds") or 0) for e in ends)
        dollars = sum(float(e.get("dollars") or 0) for e in ends)
        total = (f"<p>So far: {secs:.0f} s in finished nodes, ${dollars:.2f} meta-LLM ({tokens} tokens in "
                 f"{len(calls)} calls); GRPO steps are totalled in reports/summary.json when the run stops.</p>"
                 + _missing("no reports/summary.json: the run is in progress or was interrupted"))
    if not ends:
        return total + _missing("no node has finished yet (events.jsonl)")
    per: dict[tuple[int, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for e in ends:
        cell = per[(int(e.get("generation") or 0), str(e.get("node")))]
        cell[0] += float(e.get("seconds") or 0)
        cell[1] += float(e.get("dollars") or 0)
    nodes = list(dict.fromkeys(n for _, n in per))
    gens = sorted({g for g, _ in per})
    head = "<tr><th>gen</th>" + "".join(f"<th>{escape(n)}</th>" for n in nodes) + "</tr>"
    body = "".join("<tr><td>" + str(g) + "</td>" + "".join(
        f"<td>{per[(g, n)][0]:.1f} s" + (f", ${per[(g, n)][1]:.3f}" if per[(g, n)][1] else "") + "</td>"
        if (g, n) in per else "<td></td>" for n in nodes) + "</tr>" for g in gens)
    return total + f"<p>Seconds (and meta-LLM dollars) per node:</p><table>{head}{body}</table>"


def analyses_html(rep: RunReport) -> str:
    """`evotrainer analyze`'s three analyses of this run alone (their figures: `evotrainer analyze RUN`)."""
    from evotrainer.analyze import Analysis, read_facts, sections

    facts = read_facts(rep.path, rep)
    return "".join(sec.html() for sec in sections(Analysis(runs=[facts])))


def render(rep: RunReport) -> str:
    """The whole page."""
    s = rep.summary
    state = (f"{'finished' if s.finished else 'stopped'}: {s.stop_reason}" if s else
             "in progress or interrupted (no summary yet)")
    missing = []
    if not rep.events:
        missing.append("events.jsonl (nothing has run yet)")
    warn = "".join(f"<li>{escape(m)}</li>" for m in missing + [f"unreadable {u}" for u in rep.unreadable])
    sections = [
        ("Lineage", lineage_html(rep)),
        ("Sealed dev per generation", dev_chart(rep)),
        ("Analyzer severities across generations", health_table(rep)),
        ("Skills distilled", skills_table(rep)),
        ("Cost", cost_html(rep)),
        ("Trajectory analyses", analyses_html(rep)),
    ]
    body = "".join(f"<h2>{escape(t)}</h2>{html}" for t, html in sections)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>EvoTrainer run '
            f"{escape(rep.name)}</title><style>{CSS}</style></head><body><h1>EvoTrainer run {escape(rep.name)}</h1>"
            f"<p>domain {escape(rep.domain)}; {escape(state)}; {len(rep.lineage)} candidate branches.</p>"
            + (f'<ul class="missing">{warn}</ul>' if warn else "") + body + "</body></html>\n")


def write_report(run: str | Path, out: str | Path | None = None) -> Path:
    """Write the run's report (default `RUN/reports/report.html`) atomically; returns its path."""
    rep = read_run(run)
    path = Path(out) if out else Path(run) / "reports" / "report.html"
    if path.is_dir():
        raise UserError(f"{path} is a directory: pass --out FILE.html")
    try:
        atomic_write_text(path, render(rep))
    except OSError as e:
        raise UserError(f"cannot write the report {path} ({e.strerror}): choose another --out") from e
    return path
