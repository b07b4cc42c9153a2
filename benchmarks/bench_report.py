"""How heavy the HTML report of a run is: its size, and how long headless Chromium takes to open it.

    python benchmarks/bench_report.py RUN [--repeats 5]

Writes the page with `evotrainer report RUN --out` (the time that takes is printed too), then opens it REPEATS times
in one headless Chromium (`tests/browser.py`, the browser `make test` installs) and prints, per load, the page's own
navigation timing (`loadEventEnd`, milliseconds from the start of the navigation) and the wall time from the
navigate command to the load event, then their medians. Console errors are counted; a page with any fails the run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.browser import Browser  # noqa: E402  (the test helper: one driver of Chromium for tests and this)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    page = Path(tempfile.mkdtemp(prefix="bench-report-")) / "report.html"
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "evotrainer.cli", "report", str(args.run), "--out", str(page)],
                          capture_output=True, text=True)
    written = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(proc.stderr.strip())
    loads, walls = [], []
    with Browser() as b:
        for _ in range(args.repeats):
            b.events.clear()
            t0 = time.perf_counter()
            b.open(page)
            walls.append((time.perf_counter() - t0) * 1000)
            loads.append(b.js("performance.getEntriesByType('navigation')[0].loadEventEnd"))
        candidates = b.js("document.querySelectorAll('details.candidate').length")
        errors = b.errors
    result = {"run": str(args.run), "bytes": page.stat().st_size, "candidates": candidates,
              "write_s": round(written, 2), "load_ms": [round(x, 1) for x in loads],
              "wall_ms": [round(x, 1) for x in walls], "load_ms_median": round(statistics.median(loads), 1),
              "wall_ms_median": round(statistics.median(walls), 1), "console_errors": errors}
    print(json.dumps(result))
    if errors:
        sys.exit(f"the page reported {len(errors)} console errors: {errors[:3]}")


if __name__ == "__main__":
    main()
