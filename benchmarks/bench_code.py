"""Program-grading throughput of the code domain's sandbox on this machine.

    python benchmarks/bench_code.py [--repeats 5]

Prints the median and worst wall time of grading 128 tiny-task completions through the sealed scorer
(each program forked from a small worker, limited, in its own directory), the same with 8 hostile programs
mixed in (loop, allocation, fork, file access, early exit: one timeout costs one worker its timeout), and
the 164 HumanEval canonical solutions.
"""

from __future__ import annotations

import argparse
import statistics
import time

from evotrainer.base.settings import apply_offline_switches
from evotrainer.trainer.domains import get_domain, grade_all
from evotrainer.trainer.execution import pool

HOSTILE = ["(lambda: [0 for _ in iter(int, 1)])()", "len(bytearray(8 << 30))", "__import__('os').fork()",
           "open('/etc/passwd').read()", "__import__('sys').exit(0)", "__import__('os')._exit(0)",
           "__import__('subprocess')", "x//0"]


def timed(fn, repeats: int) -> tuple[float, float, object]:
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), max(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    apply_offline_switches()
    d = get_domain("code")
    tasks = d.tasks("train", 128, seed=1)
    answers, fmts = [t.answer for t in tasks], [t.fmt for t in tasks]
    grade_all(d, ["x"], answers[:1], fmts[:1])  # start the workers once, as a training run does
    print(f"workers: {pool().n}")

    med, worst, grades = timed(lambda: grade_all(d, [t.target for t in tasks], answers, fmts), args.repeats)
    print(f"128 correct programs:         median {med:.3f} s, worst {worst:.3f} s, "
          f"{sum(g.correct for g in grades)}/128 correct")
    mixed = [t.target for t in tasks[:120]] + HOSTILE
    med, worst, grades = timed(lambda: grade_all(d, mixed, answers, fmts), args.repeats)
    statuses = [g.columns["exec_status"] for g in grades[120:]]
    print(f"120 correct + 8 hostile:      median {med:.3f} s, worst {worst:.3f} s, hostile statuses {statuses}")

    he = d.tasks("humaneval")
    med, worst, grades = timed(lambda: grade_all(d, [t.target for t in he], [t.answer for t in he],
                                                 [t.fmt for t in he], [t.prompt for t in he]), 1)
    print(f"164 HumanEval canonical:      {med:.2f} s, {sum(g.correct for g in grades)}/164 pass")


if __name__ == "__main__":
    main()
