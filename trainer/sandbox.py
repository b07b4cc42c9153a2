"""The one way harness code and training run: a child process with limits.

Every child gets a wall-clock timeout, an address-space limit, a CPU-time limit, a working
directory, and an environment with API keys and tokens removed. It reports progress as JSON
lines on stdout (prefix `PROGRESS_PREFIX`), everything else goes to a log file. The result is a
typed `ChildResult`: ok, or failed with a reason of timeout / memory / crash / error, and the tail
of the child's log. A failing child never takes the parent down.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from evotrainer.settings import OFFLINE_ENV

PROGRESS_PREFIX = "@evotrainer-progress "
SECRET_ENV = re.compile(r"(API_KEY|_TOKEN|SECRET|PASSWORD|CREDENTIAL|^AWS_|^HF_TOKEN)", re.IGNORECASE)


class Limits(BaseModel):
    timeout_s: float = 3600.0
    memory_mb: int = 16_000  # address space; torch maps a few GB of virtual memory at import
    cpu_s: int | None = None  # defaults to 2 x timeout
    network: bool = False  # False: an empty network namespace where the OS allows one (see network_isolation)


@lru_cache(maxsize=1)
def _netns_prefix() -> tuple[str, ...]:
    """The command prefix that puts a child in an empty network namespace here, or () where none works."""
    if not shutil.which("unshare"):
        return ()
    for flags in ("-n", "-rn"):  # as root; else through a user namespace
        try:
            if subprocess.run(["unshare", flags, "true"], capture_output=True, timeout=10).returncode == 0:
                return ("unshare", flags, "--")
        except (OSError, subprocess.TimeoutExpired):
            pass
    return ()


def network_isolation() -> bool:
    """Whether children can be put in an empty network namespace on this machine."""
    return bool(_netns_prefix())


def _isolation_prefix(limits: Limits) -> list[str]:
    return [] if limits.network else list(_netns_prefix())


class ChildResult(BaseModel):
    ok: bool
    reason: Literal["ok", "timeout", "memory", "crash", "error"]
    returncode: int | None
    seconds: float
    log_tail: str = ""
    message: str = ""  # one line: what went wrong, for the user


def progress(**fields) -> None:
    """Called in a child: one progress event for the parent's display."""
    print(PROGRESS_PREFIX + json.dumps(fields), flush=True)


def child_main(entry: Callable[[list[str]], int]) -> None:
    """Run a child's entry point: bad input (a UserError) becomes one `UserError: <sentence>` line on stderr and
    exit code 3, which the parent (`jobs.run_child`) turns back into the same error."""
    from evotrainer.errors import UserError

    try:
        code = entry(sys.argv[1:])
    except UserError as e:
        print(f"UserError: {' '.join(str(e).split())}", file=sys.stderr, flush=True)
        code = 3
    sys.exit(code)


def child_env() -> dict[str, str]:
    """The parent's environment without secrets, plus the offline switches (DESIGN §10)."""
    env = {k: v for k, v in os.environ.items() if not SECRET_ENV.search(k)}
    env.update(OFFLINE_ENV)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _die_with_parent() -> None:
    """Linux: the child gets SIGKILL when the thread that started it dies, so a killed orchestrator leaves no
    training running behind it (a resumed run would otherwise race an orphan for the same directory)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _limit(limits: Limits) -> Callable[[], None]:
    def apply() -> None:
        os.setsid()  # own process group: a timeout kills the child and anything it started
        _die_with_parent()
        mem = limits.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        cpu = int(limits.cpu_s or 2 * limits.timeout_s)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
    return apply


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _last_error(tail: str) -> str:
    """The last line that looks like an exception, for the one-line message."""
    for line in reversed(tail.splitlines()):
        if re.match(r"^[A-Za-z_.]*(Error|Exception|Interrupt)\b", line.strip()):
            return line.strip()
    return tail.splitlines()[-1].strip() if tail.strip() else "no output"


def run_module(module: str, args: list[str], *, cwd: str | Path, log_path: str | Path, limits: Limits,
               on_progress: Callable[[dict], None] | None = None, label: str = "child") -> ChildResult:
    """Run `python -m module args...` under `limits` in `cwd`; stream progress events to `on_progress`."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.time()
    with open(log_path, "a") as log:
        proc = subprocess.Popen([*_isolation_prefix(limits), sys.executable, "-m", module, *args], cwd=str(cwd),
                                env=child_env(),
                                stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, text=True,
                                preexec_fn=_limit(limits))
        # a watchdog, not a check between lines: a silent hung child must be stopped too
        fired = threading.Event()

        def stop() -> None:
            fired.set()
            _kill_group(proc)

        watchdog = threading.Timer(limits.timeout_s, stop)
        watchdog.start()
        try:
            for line in proc.stdout:  # type: ignore[union-attr]
                if line.startswith(PROGRESS_PREFIX):
                    if on_progress:
                        on_progress(json.loads(line[len(PROGRESS_PREFIX):]))
                else:
                    log.write(line)
            proc.wait()
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                _kill_group(proc)
        timed_out = fired.is_set()
    rc = proc.returncode
    tail = _tail(log_path)
    seconds = round(time.time() - started, 2)
    if timed_out:
        return ChildResult(ok=False, reason="timeout", returncode=rc, seconds=seconds, log_tail=tail,
                           message=f"{label}: timed out after {limits.timeout_s:.0f}s")
    if rc == 0:
        return ChildResult(ok=True, reason="ok", returncode=0, seconds=seconds, log_tail=tail)
    if rc < 0:
        sig = signal.Signals(-rc).name
        reason = "memory" if -rc == signal.SIGKILL and "MemoryError" in tail else "crash"
        return ChildResult(ok=False, reason=reason, returncode=rc, seconds=seconds, log_tail=tail,
                           message=f"{label}: killed by {sig}")
    if "MemoryError" in tail or "std::bad_alloc" in tail or "DefaultCPUAllocator: can't allocate" in tail:
        return ChildResult(ok=False, reason="memory", returncode=rc, seconds=seconds, log_tail=tail,
                           message=f"{label}: exceeded its memory limit of {limits.memory_mb} MB")
    return ChildResult(ok=False, reason="error", returncode=rc, seconds=seconds, log_tail=tail,
                       message=f"{label}: {_last_error(tail)}")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
