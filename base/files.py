"""Writing files so that a crash never leaves half of one (a temporary file, then an atomic rename), output
directories checked writable before anything is written to them, and text a user gave read with one clear error."""

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


def set_aside(path: Path, name: Path) -> Path:
    """Where to move `path` so that nothing is overwritten: `name`, else `name` numbered (-2, -3, ...)."""
    target, n = name, 1
    while target.exists():
        n += 1
        target = name.with_name(f"{name.stem}-{n}{name.suffix}" if path.is_file() else f"{name.name}-{n}")
    return target


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


def read_user_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of a file the user gave (`what` names it in the error: "run configuration", "patch"): a
    missing, unreadable or non-UTF-8 file is one UserError naming the file and, for bad bytes, where they are."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except IsADirectoryError:
        raise UserError(f"{what} {path} is a directory, not a file: pass the file") from None
    except OSError as e:
        raise UserError(f"cannot read the {what} {path} ({e.strerror}): check the path and its permissions") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise UserError(f"{what} {path} is not UTF-8 text (byte 0x{data[e.start]:02x} at line {line}): save it as "
                        "UTF-8") from None
