"""The first code of every child `sandbox.run_module` starts, before the child's own module:

    python -m evotrainer.trainer.launch LIFELINE_FD MODULE ARGS...

- **A lifeline.** The parent holds the only write end of a pipe whose read end the child inherits as LIFELINE_FD;
  a thread here blocks reading it. When the parent dies the kernel closes its end, the read returns, and the
  child exits at once. This holds from the child's first instruction to its last, so it also covers the windows the
  parent-death signal leaves open: between `fork` and `prctl` (`sandbox._die_with_parent`), and between the exec of
  bubblewrap and bubblewrap's own `prctl` (measured: 9 orphans in 40 kills on a busy machine before this,
  `benchmarks/bench_orphans.py`). A parent already dead when the child starts leaves an end that reads as closed:
  the child exits before running anything.
- **The child's CPU seconds**, its own and its children's, reported at its end as a progress event (`CPU_KEY`): a
  child in bubblewrap's PID namespace never reaches the parent's `RUSAGE_CHILDREN`.
- Then MODULE runs as `python -m MODULE ARGS...` would.
"""

from __future__ import annotations

import os
import resource
import runpy
import select
import sys
import threading


def _watch(fd: int) -> None:
    try:
        while os.read(fd, 1):
            pass
    except OSError:
        pass
    os._exit(1)  # the parent is gone: nobody will read this child's result


def _report_cpu() -> None:
    from evotrainer.trainer.sandbox import CPU_KEY, progress

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    progress(**{CPU_KEY: round(own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime, 3)})


def main() -> None:
    fd, module, args = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    # the parent never writes, so a readable end is a closed one: a parent already gone ends the child here, before
    # its module runs (the thread below may be scheduled only after the module has started)
    if select.select([fd], [], [], 0)[0] and not os.read(fd, 1):
        os._exit(1)
    threading.Thread(target=_watch, args=(fd,), name="lifeline", daemon=True).start()
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        _report_cpu()


if __name__ == "__main__":
    main()
