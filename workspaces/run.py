"""A run workspace (DESIGN §3): one directory per co-evolution run.

    runs/<name>/
      run.yaml            domain, seed, budget, meta-LLM, paths (RunConfig)
      harness/            git repository: the only thing agents edit (main = champion line)
      worktrees/<branch>/ one worktree per live candidate
      checkpoints/<id>/   policy checkpoints + meta.json
      evidence/           rollouts as Parquet, by generation and branch
      reports/            health reports, backtests, verdicts
      graph.sqlite        LangGraph checkpointer
      events.jsonl        one line per node start/end, decision, cost

A run is driven by one process at a time: `RunWorkspace.lock()` holds an exclusive lock on
`.lock` (with the holder's pid written in it) and a second process gets a clear error.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml
from filelock import FileLock, Timeout
from pydantic import ValidationError

from evotrainer.base.config import RunConfig
from evotrainer.base.errors import UserError
from evotrainer.base.files import atomic_write_text, read_user_text
from evotrainer.workspaces.repo import HarnessRepo
from evotrainer.workspaces.source import StartingHarness

LAYOUT = ("harness", "worktrees", "checkpoints", "evidence", "reports")


class RunWorkspace:
    def __init__(self, path: str | Path):
        self.path = Path(path).resolve()

    @property
    def config_path(self) -> Path:
        return self.path / "run.yaml"

    @property
    def harness(self) -> HarnessRepo:
        return HarnessRepo(self.path / "harness")

    @classmethod
    def create(cls, path: str | Path, domain: str, *, seed: int = 0, force: bool = False,
               harness: StartingHarness | None = None, **config) -> RunWorkspace:
        """A new run directory with its harness repository initialised from `harness` (checked by the caller:
        `workspaces.source`, `jobs.validate_harness`), by default the domain's template."""
        from evotrainer.trainer.domains import get_domain
        from evotrainer.trainer.evaluate import check_sealed

        path = Path(path)
        if path.exists() and not path.is_dir():
            raise UserError(f"{path} is a file: a run is a directory; choose a new directory")
        if path.exists() and any(path.iterdir()) and not force:
            raise UserError(f"{path} is not empty: choose a new directory (`evotrainer init --force` adds a run to a "
                            "non-empty one)")
        if (path / "run.yaml").exists():
            raise UserError(f"{path} already holds a run (run.yaml exists): choose a new directory")
        fp = check_sealed(get_domain(domain))
        if harness is not None and harness.domain != domain:
            raise UserError(f"harness {harness.path} is for domain {harness.domain!r}, not {domain!r}")
        cfg = RunConfig(name=path.resolve().name, domain=domain, seed=seed, fingerprint=fp,
                        harness=None if harness is None or harness.template else str(harness.path), **config)
        path.mkdir(parents=True, exist_ok=True)
        for d in LAYOUT[1:]:
            (path / d).mkdir(exist_ok=True)
        HarnessRepo.init_from_template(path / "harness", domain, harness)
        # run.yaml last: its presence means the run is complete
        atomic_write_text(path / "run.yaml", yaml.safe_dump(cfg.model_dump(), sort_keys=False))
        return cls(path)

    @classmethod
    def open(cls, path: str | Path) -> RunWorkspace:
        """An existing run, validated; one clear error when the directory is not a run."""
        ws = cls(path)
        ws.config()
        missing = [d for d in LAYOUT if not (ws.path / d).is_dir()]
        if missing:
            raise UserError(f"run {ws.path} is incomplete (missing {', '.join(missing)}/): it may have been "
                            "created by an interrupted `evotrainer init`; remove it and run init again")
        return ws

    def config(self) -> RunConfig:
        if not self.config_path.is_file():
            raise UserError(f"{self.path} is not an EvoTrainer run (no run.yaml): create one with "
                            "`evotrainer init --domain D DIR`")
        try:
            return RunConfig.model_validate(yaml.safe_load(read_user_text(self.config_path, "run configuration")))
        except (yaml.YAMLError, ValidationError) as e:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise UserError(f"{self.config_path} is not a valid run configuration: {first}") from e

    # -- the champion policy --------------------------------------------------------------------
    @property
    def _champion_file(self) -> Path:
        return self.path / "checkpoints" / "champion.json"

    def champion_checkpoint(self) -> Path | None:
        """The policy the champion line has reached (None: the domain's warm policy, not yet trained here)."""
        if not self._champion_file.is_file():
            return None
        path = Path(json.loads(self._champion_file.read_text())["checkpoint"])
        if not (path / "config.json").is_file():
            raise UserError(f"the champion checkpoint {path} named in {self._champion_file} is missing: restore it "
                            "or remove that file to start from the warm policy")
        return path

    def set_champion(self, checkpoint: str | Path, generation: int) -> None:
        """Record the champion policy (atomically: a crash leaves the previous champion)."""
        checkpoint = Path(checkpoint).resolve()
        if not (checkpoint / "config.json").is_file():
            raise UserError(f"checkpoint {checkpoint} not found or not a model directory (no config.json)")
        atomic_write_text(self._champion_file, json.dumps({"checkpoint": str(checkpoint), "generation": generation}))

    # -- the Critic's verdicts --------------------------------------------------------------------
    def verdict_path(self, branch: str) -> Path:
        from evotrainer.trainer.evidence import branch_dir

        return self.path / "reports" / f"verdict-{branch_dir(branch)}.json"

    def snapshot(self, ref: str = "main") -> tuple[str, Path]:
        """The commit of `ref` and its files as a plain directory keyed by commit (`backtests/harness/<commit>`):
        training, replays and agents read snapshots, so worktrees may change or go meanwhile."""
        repo = self.harness
        commit = repo.head(ref)
        return commit, repo.export(commit, self.path / "backtests" / "harness" / commit[:12])

    # -- backtests: the run as paths and commits -----------------------------------------------------
    def bench(self, generation: int):
        """What a backtest of this generation's candidates needs of the run (`trainer.backtest.Bench`)."""
        from evotrainer.trainer.backtest import Bench

        cfg = self.config()
        start = self.champion_checkpoint() or (Path(cfg.checkpoint) if cfg.checkpoint else None)
        return Bench(run=str(self.path), domain=cfg.domain, seed=cfg.seed, fingerprint=cfg.fingerprint,
                     generation=generation, horizon=cfg.loop.horizon(cfg.budget.generations),
                     champion=self.harness_at("main"), start=str(start) if start else None)

    def harness_at(self, branch: str, ref: str | None = None):
        """A branch's harness at `ref` (default: the branch's head) as a snapshot (`trainer.backtest.Harness`)."""
        from evotrainer.trainer.backtest import Harness

        commit, path = self.snapshot(ref or branch)
        return Harness(branch=branch, commit=commit, dir=str(path))

    def backtest(self, branch: str, **options):
        """Backtest one candidate branch of this run (`trainer.backtest.backtest`; `options` are its keywords)."""
        from evotrainer.trainer.backtest import backtest

        record = next((r for r in self.harness.lineage() if r.branch == branch), None)
        if record is None:
            known = ", ".join(r.branch for r in self.harness.lineage()) or "none yet"
            raise UserError(f"branch {branch!r} is not a candidate of run {self.path} (candidates: {known})")
        options.setdefault("cfg", self.config().loop.backtest)
        return backtest(self.bench(record.generation), self.harness_at(branch, record.head), **options)

    def starting_policy(self, on_progress=None) -> Path:
        """The policy the next training starts from: the champion, else the run's `checkpoint`, else the domain's
        cached warm policy (built on a miss)."""
        champion = self.champion_checkpoint()
        if champion is not None:
            return champion
        cfg = self.config()
        if cfg.checkpoint:
            return Path(cfg.checkpoint)
        from evotrainer.trainer import jobs

        return jobs.warm_policy(cfg.domain, cfg.seed, self.path, on_progress=on_progress)

    def validate_analyzers(self, harness_dir: str | Path, only: list[str] | None = None):
        """The analyzers of `harness_dir` replayed over every judged candidate branch of this run
        (`trainer.diagnostics.history`), judged by the champion's thresholds."""
        from evotrainer.trainer.diagnostics.history import Slice, validate_on_history
        from evotrainer.trainer.harness import load_spec

        slices = [Slice(generation=r.generation, branch=r.branch, status=r.status) for r in self.harness.lineage()]
        return validate_on_history(harness_dir, slices, evidence=self.path / "evidence",
                                   thresholds=load_spec(self.path / "harness").analyzers, work=self.path, only=only)

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive ownership of the run; a second driver (another process, or another thread of this one) gets an
        error naming the holder's pid at once, never waits."""
        lock_path = self.path / ".lock"

        def write_pid(fd: int) -> None:  # into the file filelock opened and holds, once it holds it
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)

        try:
            held = FileLock(lock_path, timeout=0, on_acquired=write_pid).acquire()
        except Timeout:
            try:
                holder = lock_path.read_text().strip() or "unknown"
            except OSError:
                holder = "unknown"
            raise UserError(f"run {self.path} is already being driven by process {holder}: wait for it to end "
                            "or stop it") from None
        with held:
            try:
                yield
            finally:
                os.truncate(lock_path, 0)  # still held: no pid of a process that no longer drives the run
