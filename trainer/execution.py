"""Running untrusted programs: a pool of small worker processes, each program in a forked, limited child.

Used by the code domain's sealed scorer and by harness reward functions (the one package module a harness
may import to run the programs it grades). A worker (`program_worker.py`, standard library only, started
with `python -I -S`) forks one child per program, so a program that loops, allocates without end, forks,
exits early, or reaches for files outside its temporary directory is contained and reported, and the next
program runs as if nothing happened. Workers sit in an empty network namespace where the OS allows one.

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
        return cls(status=d.get("status", "crash"), outputs=d.get("outputs") or [], errors=d.get("errors") or [],
                   error=d.get("error"), violations=d.get("violations") or [], seconds=d.get("seconds", 0.0))


class _Worker:
    def __init__(self):
        from evotrainer.trainer.sandbox import _netns_prefix

        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
        self.proc = subprocess.Popen([*_netns_prefix(), sys.executable, "-I", "-S", str(WORKER)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env=env, cwd="/", start_new_session=True)

    def run(self, jobs: list[dict], timeout_s: float, memory_mb: int) -> list[dict]:
        self.proc.stdin.write(json.dumps({"jobs": jobs, "timeout_s": timeout_s, "memory_mb": memory_mb}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"program worker exited with code {self.proc.poll()}")
        return json.loads(line)

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
        """Outcomes of `jobs` ({"code", optional "calls" (argument lists) and "entry"}), in order."""
        if not jobs:
            return []
        with self._lock:
            k = min(self.n, len(jobs))
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
    """Run each program as a script: status 'ok' when it ends without an exception (HumanEval's check)."""
    return pool().run([{"code": c} for c in codes], timeout_s=timeout_s, memory_mb=memory_mb)
