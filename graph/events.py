"""`events.jsonl`: one line per node start and end, decision and cost, appended and flushed at once.

A killed run leaves a `start` without its `end`; a resumed one appends after it. Reading the file tells
which nodes ran, which were redone, and what each decision was.
"""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path


class EventLog:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    def emit(self, event: str, **fields) -> dict:
        row = {"t": datetime.now(UTC).isoformat(timespec="milliseconds"), "ts": round(time.time(), 3),
               "event": event, "pid": os.getpid(), **fields}
        with open(self.path, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
        return row

    def read(self) -> list[dict]:
        if not self.path.is_file():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a kill: the events before it still count
                continue
        return out
