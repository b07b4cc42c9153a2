"""Writing files so that a crash never leaves half of one: a temporary file, then an atomic rename."""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write `text` to `path` through a temporary file and `os.replace`; readers see the old file or the new one,
    also when several processes write it at once (each has its own temporary file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path
