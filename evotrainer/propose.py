"""An engineer's own candidate through the Coder's path (`evotrainer propose`) and the rule's verdict on it.

A unified diff against the champion harness becomes a candidate branch exactly as the Coder makes one: only
harness files (`agents.coder.check_path`), regular files only, validated in the sandbox, committed with the
same trailers (intervention id, hypothesis, factor, generation). `evotrainer backtest RUN BRANCH --judge`
then ends with the promotion rule's verdict (`verdict_for`), the same rule the loop's Critic applies.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

from pydantic import BaseModel

from evotrainer.base.errors import UserError
from evotrainer.base.files import read_user_text


class Proposal(BaseModel):
    branch: str
    commit: str
    generation: int
    files: list[str]


def next_generation(run_dir: Path) -> int:
    """The generation a hand-made candidate belongs to: the one after the champion line's latest evidence, so its
    replay reads the rollouts the loop's own candidates would read."""
    gens = [int(m.group(1)) for p in (run_dir / "evidence").glob("g*/main")
            if (m := re.fullmatch(r"g(\d+)", p.parent.name)) and any(p.glob("rollouts-*.parquet"))]
    return max(gens, default=0) + 1


def apply_patch(files: dict[str, str], patch: str) -> dict[str, str]:
    """The harness files a unified diff changes (path -> new text), applied by `git apply` to a scratch copy of
    `files`. Refused: a path outside the harness files, a rename, a mode change, a symlink, a patch that does
    not apply or changes nothing."""
    from evotrainer.agents.coder import EditFailed, check_path
    from evotrainer.workspaces.repo import GitFailed, _run

    scratch = Path(tempfile.mkdtemp(prefix="evotrainer-propose-"))
    try:
        for rel, text in files.items():
            (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
            (scratch / rel).write_text(text)
        (scratch / "change.diff").write_text(patch)
        try:
            summary = _run(["apply", "--summary", "--numstat", "change.diff"], cwd=scratch).decode()
        except GitFailed as e:
            raise UserError(f"the patch cannot be read: {e}; give a unified diff (git diff) of harness files") from e
        paths = []
        for line in summary.splitlines():
            parts = line.split("\t")
            if len(parts) == 3:
                paths.append(parts[2])
            elif line.strip():  # --summary lines: create/delete/rename/mode change
                if not re.match(r"\s*create (mode 100644 )?\S", line):  # a new regular file: its path is checked
                    raise UserError(f"the patch does more than edit file contents ({line.strip()}): renames, "
                                    "deletions, mode changes and links are refused")
        if not paths:
            raise UserError("the patch changes no file: give a unified diff (git diff) of harness files")
        for p in paths:
            try:
                check_path(p)
            except EditFailed as e:
                raise UserError(f"the patch touches {e}") from e
        try:
            _run(["apply", "--whitespace=nowarn", "change.diff"], cwd=scratch)
        except GitFailed as e:
            raise UserError(f"the patch does not apply to the champion harness: {e}") from e
        changed = {}
        for p in paths:
            target = scratch / p
            if target.is_symlink() or not target.is_file():
                raise UserError(f"the patch leaves {p} as something other than a regular file")
            try:
                text = target.read_text()
            except UnicodeError as e:
                raise UserError(f"the patch leaves {p} as something other than text ({e.reason})") from e
            if files.get(p) != text:
                changed[p] = text
        if not changed:
            raise UserError("the patch changes nothing in the champion harness")
        return changed
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def propose(run_dir: str | Path, patch_file: str | Path, factor: str, hypothesis: str, name: str | None = None
            ) -> Proposal:
    """Create a candidate branch of run `run_dir` from a unified diff against its champion harness."""
    from evotrainer.agents.coder import harness_files
    from evotrainer.trainer import jobs
    from evotrainer.workspaces.repo import slugify
    from evotrainer.workspaces.run import RunWorkspace

    ws = RunWorkspace.open(run_dir)
    patch = read_user_text(patch_file, "patch")
    if not factor.strip() or not hypothesis.strip():
        raise UserError("--factor and --hypothesis must not be empty: name the one thing changed and what it "
                        "should improve")
    changed = apply_patch(harness_files(ws.snapshot("main")[1]), patch)
    g, repo = next_generation(ws.path), ws.harness
    branch, tree = repo.create_candidate(g, name or slugify(factor), ws.path / "worktrees")
    try:
        repo.write_files(tree, changed)
        problems = jobs.validate_harness(tree, ws.path, label=f"candidate {branch}")
        if problems:
            raise UserError(f"the proposed harness is invalid: {problems[0]}")
        commit = repo.commit(tree, f"Proposed by hand: {factor}", intervention_id=f"g{g}-{slugify(name or factor)}",
                             hypothesis=hypothesis, factor=factor, generation=g, paths=list(changed))
    except BaseException:
        repo.discard(branch)  # nothing half-made is left behind
        raise
    return Proposal(branch=branch, commit=commit, generation=g, files=sorted(changed))


def verdict_for(run_dir: str | Path, result):
    """The promotion rule's verdict on a backtest result of run `run_dir` (its run.yaml's rule), as the Critic
    would start from it; written to reports/verdict-<branch>.json."""
    from evotrainer.agents.critic import judge
    from evotrainer.agents.schemas import Intervention, VerdictRecord
    from evotrainer.trainer.backtest.replay import critical_defects, gate_keys
    from evotrainer.trainer.diagnostics.report import HealthReport
    from evotrainer.workspaces.run import RunWorkspace

    ws = RunWorkspace.open(run_dir)
    rule = ws.config().loop.rule()
    record = next(r for r in ws.harness.lineage() if r.branch == result.branch)
    iv = Intervention(id=record.intervention_id or record.branch, hypothesis=record.hypothesis or "(none)",
                      factor=record.factor or "(none)", change=record.factor or "(none)")
    # as in the loop, a repair must repair a gate the main line fails, a fix a defect it shows at critical severity:
    # its health before this generation's candidates
    health = ws.path / "reports" / f"health-g{record.generation - 1}-main.json"
    findings = HealthReport.model_validate_json(health.read_text()).findings if health.is_file() else None
    verdict = judge(iv, result, rule, champion_gates=None if findings is None else gate_keys(findings),
                    champion_defects=None if findings is None else critical_defects(findings))
    VerdictRecord(**verdict.model_dump(), intervention=iv, author="promotion rule",
                  generation=record.generation).save(ws.verdict_path(result.branch))
    return verdict
