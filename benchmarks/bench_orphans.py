"""How often a child outlives a parent killed right after starting it, and whether an isolated child's CPU time
reaches its parent's accounting.

    python benchmarks/bench_orphans.py [--trials 40]

1. Orphans: a parent process starts an isolated child (`sandbox.run_module` under bubblewrap, from a thread as
   the backtest does) and is SIGKILLed 0-90 ms after the child's log file appears, the moment `tests/test_loop.py`
   kills its orchestrator. A child still running a second later is an orphan. Before the re-parenting check in
   `sandbox._die_with_parent` this found 7 of 40 (2026-12-05, machine otherwise idle); after it 0 of 40 idle, but
   9 of 40 with two comparison processes busy on both cores: the survivors were bubblewrap (re-parented to init)
   and its child, a window between the exec of bubblewrap and its own parent-death signal. With the lifeline every
   child holds since (`trainer/launch.py`: a pipe only the parent can write, read to its end by a thread of the
   child): 0 of 40 with both cores busy with two comparison processes (2026-12-05 17:00 UTC).
2. CPU accounting: a 3-second busy loop run plain and isolated; the parent's RUSAGE_CHILDREN before and after,
   and what the isolated child reports at its end (`sandbox.isolated_cpu_seconds`, which compare adds).
   Measured: 3.0 s plain, 0.0 s isolated (a process inside bubblewrap's PID namespace is not reaped by the
   parent's descendants), so `evotrainer compare`'s CPU seconds left isolated training out until every child
   reported its own at its end (`trainer/launch.py`): now 3.17 s plain (RUSAGE_CHILDREN), 3.14 s isolated
   (reported), the isolated report the only one counted.
"""

from __future__ import annotations

import argparse
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PARENT = '''
import sys, threading
from pathlib import Path
from evotrainer.trainer.sandbox import Isolation, Limits, run_module
d = Path(sys.argv[1])
iso = Isolation(read=[str(d)], write=[str(d / "out")])
t = threading.Thread(target=run_module, args=("sleeper_orphan", [str(d / "marker")]),
                     kwargs=dict(cwd=d, log_path=d / "log", limits=Limits(timeout_s=600), isolation=iso))
t.start()
t.join()
'''


def orphans(trials: int, root: Path) -> int:
    found = 0
    for i in range(trials):
        d = root / f"r{i}"
        d.mkdir()
        (d / "sleeper_orphan.py").write_text("import time\nwhile True: time.sleep(1)\n")
        parent = subprocess.Popen([sys.executable, "-c", PARENT, str(d)])
        while not (d / "log").exists():
            time.sleep(0.001)
        time.sleep(random.randrange(10) / 100)
        parent.kill()
        parent.wait()
        time.sleep(1.0)
        alive = subprocess.run(["pgrep", "-f", f"sleeper_orphan.*{d}/marker"], capture_output=True, text=True)
        if alive.stdout.split():
            found += 1
            subprocess.run(["pkill", "-9", "-f", f"{d}/marker"])
    return found


def cpu_seen(root: Path) -> dict[str, float]:
    from evotrainer.trainer.sandbox import Isolation, Limits, isolated_cpu_seconds, run_module

    (root / "busy_cpu.py").write_text("import time\nfrom evotrainer.trainer.sandbox import child_main\n"
                                      "def main(argv):\n    t = time.process_time()\n"
                                      "    while time.process_time() - t < 3: pass\n    return 0\nchild_main(main)\n")
    sys.path.insert(0, str(root))
    out = {}
    for name, iso in (("plain", None), ("isolated", Isolation(read=[str(root)], write=[str(root / "out")]))):
        before, reported = resource.getrusage(resource.RUSAGE_CHILDREN), isolated_cpu_seconds()
        run_module("busy_cpu", [], cwd=root, log_path=root / "log", limits=Limits(timeout_s=60), isolation=iso)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        out[f"{name} (RUSAGE_CHILDREN)"] = round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2)
        out[f"{name} (reported by the child)"] = round(isolated_cpu_seconds() - reported, 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=40)
    args = ap.parse_args()
    # under the repository, not /tmp: bubblewrap gives a child its own /tmp
    with tempfile.TemporaryDirectory(dir=Path(__file__).resolve().parent) as tmp:
        n = orphans(args.trials, Path(tmp))
        print(f"orphans: {n} of {args.trials} children outlived a parent killed right after starting them")
        print("CPU seconds the parent sees of a 3 s busy child:", cpu_seen(Path(tmp)))


if __name__ == "__main__":
    main()
