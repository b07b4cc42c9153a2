"""Running untrusted programs: a pool of small worker processes, each program in a forked, limited child.

Used by the code domain's sealed scorer and by harness reward functions (the one package module a harness
may import to run the programs it grades). A worker (`program_worker.py`, standard library only, started
with `python -I -S`) forks one child per program, so a program that loops, allocates without end, forks,
exits early, or reaches for files outside its temporary directory is contained and reported, and the next
program runs as if nothing happened. Workers start under bubblewrap (`sandbox.bwrap_prefix`: no network, a
private /tmp, the machine's files read-only, the domains out of view) unless this process is already isolated
or the user opted out (`sandbox.isolation_mode`); then in an empty network namespace where the OS allows one.

What a program's child reports is its answers, never its verdict (see `program_worker.py`): a function job's
outputs are compared by the caller; a check job (`check`: code defining `check(candidate)`, `entry`) runs the
check in a separate process that holds no untrusted code. Each batch carries an id its answer must echo with
one result per job; a worker that answers anything else is replaced and its programs are a `crash`.

    from evotrainer.trainer.execution import run_functions
    outcomes = run_functions(["def f(x):\\n    return 2*x"], [[[1], [2]]])
    outcomes[0].status, outcomes[0].outputs      # 'ok', [2, 4]

Grading 128 tiny programs takes ~0.1 s on 2 cores (`python benchmarks/bench_code.py`).
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

STATUSES = ("ok", "syntax_error", "runtime_error", "timeout", "memory", "forbidden", "early_exit", "crash")
WORKER = Path(__file__).with_name("program_worker.py")


@dataclass
class Outcome:
    """What one program did. `outputs[i]` / `errors[i]` belong to the i-th call (None when it raised / did not)."""

    status: str
    outputs: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    error: str | None = None
    violations: list = field(default_factory=list)
    seconds: float = 0.0

    @classmethod
    def from_json(cls, d: dict) -> Outcome:
        status = d.get("status") if d.get("status") in STATUSES else "crash"
        return cls(status=status, outputs=d.get("outputs") or [], errors=d.get("errors") or [],
                   error=d.get("error"), violations=d.get("violations") or [], seconds=d.get("seconds", 0.0))


def _prefix() -> list[str]:
    """How a worker starts: under bubblewrap, or (already isolated, or opted out) in an empty network namespace."""
    from evotrainer.trainer import sandbox

    if not sandbox.inside_isolation() and sandbox.isolation_mode() == "bwrap":
        return sandbox.bwrap_prefix(sandbox.Isolation(), cwd="/")
    return list(sandbox._netns_prefix())


class _Worker:
    def __init__(self):
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
        self.proc = subprocess.Popen([*_prefix(), sys.executable, "-I", "-S", str(WORKER)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env=env, cwd="/", start_new_session=True)
        self.batches = 0

    def run(self, jobs: list[dict], timeout_s: float, memory_mb: int) -> list[dict]:
        self.batches += 1
        batch = {"id": self.batches, "jobs": jobs, "timeout_s": timeout_s, "memory_mb": memory_mb}
        self.proc.stdin.write(json.dumps(batch) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"program worker exited with code {self.proc.poll()}")
        answer = json.loads(line)
        results = answer.get("results") if isinstance(answer, dict) else None
        if (not isinstance(results, list) or answer.get("id") != self.batches or len(results) != len(jobs)
                or not all(isinstance(r, dict) for r in results)):
            raise RuntimeError("program worker answered out of step with its batch")
        return results

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


class ProgramPool:
    """`workers` long-lived workers; a batch is split between them and run side by side."""

    def __init__(self, workers: int | None = None):
        self.n = workers or min(4, os.cpu_count() or 1)
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()

    def run(self, jobs: list[dict], *, timeout_s: float = 1.0, memory_mb: int = 256) -> list[Outcome]:
        """Outcomes of `jobs`, in order: {"code", "calls" (argument lists), "entry"} (a function job), {"code",
        "check", "entry"} (a check job) or {"code"} (a script job)."""
        if not jobs:
            return []
        checks = [i for i, j in enumerate(jobs) if "check" in j]
        if 0 < len(checks) < len(jobs):  # never one batch: a forked program must not find a check in its worker
            others = [i for i, j in enumerate(jobs) if "check" not in j]
            outcomes: list[Outcome] = [Outcome("crash")] * len(jobs)
            for part in (checks, others):
                for i, o in zip(part, self.run([jobs[i] for i in part], timeout_s=timeout_s, memory_mb=memory_mb)):
                    outcomes[i] = o
            return outcomes
        with self._lock:
            k = min(self.n, len(jobs))
            for i, w in enumerate(self._workers):  # one that died between batches: its next programs are innocent
                if w.proc.poll() is not None:
                    w.close()
                    self._workers[i] = _Worker()
            while len(self._workers) < k:
                self._workers.append(_Worker())
            chunks = [list(range(i, len(jobs), k)) for i in range(k)]  # interleaved: similar work per worker
            results: list[dict | None] = [None] * len(jobs)

            def work(w: int) -> None:
                try:
                    out = self._workers[w].run([jobs[i] for i in chunks[w]], timeout_s, memory_mb)
                except (OSError, RuntimeError, ValueError) as e:  # a dead worker: its programs crash, it is replaced
                    self._workers[w].close()
                    self._workers[w] = _Worker()
                    out = [{"status": "crash", "error": f"worker failed: {e}"}] * len(chunks[w])
                for i, r in zip(chunks[w], out):
                    results[i] = r

            with ThreadPoolExecutor(k) as ex:
                list(ex.map(work, range(k)))
            return [Outcome.from_json(r or {}) for r in results]

    def close(self) -> None:
        with self._lock:
            for w in self._workers:
                w.close()
            self._workers.clear()


_POOL: ProgramPool | None = None


def pool() -> ProgramPool:
    """The process's shared pool, started on first use and stopped at exit."""
    global _POOL
    if _POOL is None:
        _POOL = ProgramPool()
        atexit.register(_POOL.close)
    return _POOL


def run_functions(codes: list[str], calls: list[list[list]], entry: str = "f", *, timeout_s: float = 1.0,
                  memory_mb: int = 256) -> list[Outcome]:
    """Define each program, then call `entry(*args)` for each argument list of its `calls`."""
    return pool().run([{"code": c, "calls": a, "entry": entry} for c, a in zip(codes, calls)],
                      timeout_s=timeout_s, memory_mb=memory_mb)


def run_scripts(codes: list[str], *, timeout_s: float = 3.0, memory_mb: int = 512) -> list[Outcome]:
    """Run each program as a script: status 'ok' when it ends without an exception, as the program itself
    reports it (a claim it can forge: grade hidden tests with function or check jobs)."""
    return pool().run([{"code": c} for c in codes], timeout_s=timeout_s, memory_mb=memory_mb)
