"""How long the limits take to stop what they stop, on this machine.

    python benchmarks/bench_limits.py [--repeats 5]

Prints, over `--repeats` runs, the median and worst wall time of:
- a child under `sandbox.run_module` that sleeps forever, with a 2-s timeout: only the watchdog can end it (it
  spends no CPU time), so the overshoot beyond 2 s is the watchdog's reaction plus the process group's teardown;
- a child that burns CPU in two processes, under a 2-CPU-second limit of the whole child (`Limits.cpu_s`, counted
  by its cgroup where one can be made): the CPU seconds it had used when stopped (the overshoot is the watchdog's
  half-second poll times the cores it ran on) and the wall time;
- a program in the program sandbox (`execution.run_functions`) that loops forever, with a 1-s timeout, beside an
  honest one: the worker's kill, as the program's own `seconds` and as the caller's wall time.

The tests check that both are stopped with the right reason (`tests/test_sandbox.py`, `tests/test_code_domain.py`);
how fast is measured here, where a loaded machine shows up as a number instead of a failed test. Grading throughput
is `benchmarks/bench_code.py`.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from evotrainer.base.settings import apply_offline_switches
from evotrainer.trainer.execution import run_functions
from evotrainer.trainer.sandbox import Limits, run_module

LOOP = "def f(x):\n    while True:\n        pass\n"
HONEST = "def f(x):\n    return 2*x+1\n"


def spread(times: list[float]) -> str:
    return f"median {statistics.median(times):.2f} s, worst {max(times):.2f} s"


def watchdog(repeats: int, timeout_s: float = 2.0) -> list[float]:
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "hang.py").write_text("import time\nwhile True:\n    time.sleep(1)\n")
        for i in range(repeats):
            t = time.perf_counter()
            res = run_module("hang", [], cwd=root, log_path=root / f"log{i}", limits=Limits(timeout_s=timeout_s))
            times.append(time.perf_counter() - t)
            assert res.reason == "timeout", res
    return times


def cpu_limit(repeats: int, cpu_s: int = 2) -> tuple[list[float], list[float]]:
    used, times = [], []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "burn.py").write_text("import os\nos.fork()\nwhile True:\n    pass\n")
        for i in range(repeats):
            t = time.perf_counter()
            res = run_module("burn", [], cwd=root, log_path=root / f"log{i}", limits=Limits(cpu_s=cpu_s, timeout_s=60))
            times.append(time.perf_counter() - t)
            assert res.reason == "timeout" and "CPU seconds" in res.message, res
            used.append(res.cpu_seconds if res.cpu_seconds is not None else float("nan"))
    return used, times


def program_timeout(repeats: int, timeout_s: float = 1.0) -> tuple[list[float], list[float]]:
    run_functions([HONEST], [[[1]]])  # start the workers once, as a grading run does
    own, wall = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        out = run_functions([HONEST, LOOP, HONEST], [[[1], [2]]] * 3, timeout_s=timeout_s)
        wall.append(time.perf_counter() - t)
        assert [o.status for o in out] == ["ok", "timeout", "ok"], out
        own.append(out[1].seconds)
    return own, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    apply_offline_switches()
    print(f"sandbox watchdog, 2-s timeout on a sleeping child:   {spread(watchdog(args.repeats))}")
    used, wall = cpu_limit(args.repeats)
    print(f"sandbox CPU limit, 2 CPU s on two busy processes:    CPU used {spread(used)}; wall {spread(wall)}")
    own, wall = program_timeout(args.repeats)
    print(f"program sandbox, 1-s timeout on an endless loop:     program {spread(own)}; "
          f"batch of 3 (caller) {spread(wall)}")


if __name__ == "__main__":
    main()
