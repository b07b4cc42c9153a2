"""Writing files so that a crash never leaves half of one (a temporary file, then an atomic rename), and output
directories checked writable before anything is written to them."""

from __future__ import annotations

import os
from pathlib import Path

from evotrainer.base.errors import UserError


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write `text` to `path` through a temporary file and `os.replace`; readers see the old file or the new one,
    also when several processes write it at once (each has its own temporary file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def writable_dir(out: Path) -> Path:
    """`out`, created when missing and checked writable (one UserError otherwise), resolved."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-probe"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise UserError(f"output directory {out} is not writable ({e.strerror}): choose another --out") from e
    return out.resolve()
