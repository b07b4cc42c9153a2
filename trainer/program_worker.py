"""A program-execution worker: runs untrusted programs one by one, each in a forked, limited child.

Started by `evotrainer.trainer.execution.ProgramPool` as `python -I -S program_worker.py` (isolated
mode, no site-packages: this file imports only the standard library, so the worker stays small and a
fork of it is cheap). It reads one JSON batch per line on stdin and answers one JSON line on stdout.

Per program, the forked child:
- gets its own process group (killed as a whole afterwards, so a forked grandchild dies too),
  an address-space limit, a CPU-time limit, a file-size limit, no core dumps;
- runs in a fresh temporary directory (removed afterwards);
- runs under an audit hook that refuses, and records as a violation: process creation (fork, exec,
  system, spawn, subprocess), signals to other processes, sockets, ctypes, raising resource limits,
  changing directory, writing or deleting outside its directory, and reading files outside the
  standard library and its directory (the hidden tests and the repository are not readable);
- never sees expected outputs: it returns what the program computed, the caller compares.

The worker waits for the child's result with a wall-clock deadline and kills the process group when it
passes. Statuses: ok, syntax_error, runtime_error, timeout, memory, forbidden, early_exit, crash.
"""

import json
import os
import resource
import select
import shutil
import signal
import sys
import sysconfig
import tempfile
import time

MAX_RESULT_BYTES = 1 << 20
MAX_OUTPUT_CHARS = 2000

_DENY_ALWAYS = (
    "os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen",
    "os.kill", "os.killpg", "signal.pthread_kill", "resource.setrlimit", "resource.prlimit", "os.chdir",
    "os.fchdir", "os.chroot", "pty.spawn", "sys.addaudithook", "os.setuid", "os.setgid", "os.startfile",
    "os.putenv", "os.unsetenv", "webbrowser.open",
)
_DENY_PREFIX = ("socket.", "ctypes.", "_ctypes.", "mmap.", "ftplib.", "http.", "urllib.", "smtplib.", "imaplib.",
                "poplib.", "telnetlib.", "nntplib.", "ensurepip.", "gc.get_referrers", "gc.get_objects")
_PATH_EVENTS = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link", "os.symlink",
                "os.truncate", "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.copytree", "shutil.move")
_LIST_EVENTS = ("os.listdir", "os.scandir")
_DENY_IMPORT = {"ctypes", "_ctypes", "subprocess", "_posixsubprocess", "socket", "_socket", "multiprocessing",
                "pty", "mmap", "importlib.util", "evotrainer"}


_STDLIB = tuple({os.path.realpath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "platstdlib")})


def _install_hook(workdir: str, report_fd: int) -> None:
    """Refuse what a graded program must not do. Every refusal is written to the worker at once, so a program
    that catches the error cannot hide it."""
    writable = os.path.realpath(workdir) + os.sep
    readable = (*_STDLIB, writable)

    def inside(path, roots) -> bool:
        if isinstance(path, int):  # a file descriptor already open
            return True
        try:
            p = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        return any((p + os.sep).startswith(r) for r in roots)

    def deny(what: str):
        _send(report_fd, "V", what[:200])
        raise PermissionError(f"sandbox: {what} is not allowed")

    def hook(event, args):
        if event == "open":
            path, mode = args[0], args[1] or "r"
            writing = any(c in str(mode) for c in "wax+") or (isinstance(args[2], int) and args[2] & (
                os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC))
            if not inside(path, (writable,) if writing else readable):
                deny(f"{'writing' if writing else 'reading'} {path!r}")
        elif event in _LIST_EVENTS:
            if not inside(args[0] if args[0] is not None else ".", readable):
                deny(f"listing {args[0]!r}")
        elif event in _PATH_EVENTS:
            if not inside(args[0], (writable,)) or (len(args) > 1 and isinstance(args[1], (str, bytes))
                                                   and event in ("os.rename", "os.link", "os.symlink")
                                                   and not inside(args[1], (writable,))):
                deny(f"{event} on {args[0]!r}")
        elif event == "import":
            name = args[0] or ""
            if name in _DENY_IMPORT or name.split(".")[0] in _DENY_IMPORT:
                deny(f"import {name}")
        elif event in _DENY_ALWAYS or event.startswith(_DENY_PREFIX):
            deny(event)

    sys.addaudithook(hook)


def _jsonable(value, depth: int = 0):
    """The program's value as JSON data the caller can compare with ==; anything else as its repr."""
    if value is None or isinstance(value, (bool, str)):
        return value if not isinstance(value, str) else value[:MAX_OUTPUT_CHARS]
    if isinstance(value, int):
        return value if abs(value) < 1 << 62 else {"repr": "<int too large>"}
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else {"repr": repr(value)}
    if isinstance(value, (list, tuple)) and depth < 3 and len(value) <= 200:
        return [_jsonable(v, depth + 1) for v in value]
    try:
        return {"repr": repr(value)[:200]}
    except Exception:  # noqa: BLE001 - a hostile __repr__
        return {"repr": "<unrepresentable>"}


def _send(fd: int, kind: str, payload) -> None:
    """One framed line to the worker: `V <json>` for a violation, `R <json>` for the result."""
    view = memoryview(f"{kind} {json.dumps(payload)}\n".encode())
    while view:
        view = view[os.write(fd, view):]


def _run_in_child(job: dict, workdir: str, memory_mb: int, cpu_s: int, report_fd: int) -> dict:
    os.setpgid(0, 0)
    mem = memory_mb << 20
    for res, value in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_CORE, 0),
                       (resource.RLIMIT_FSIZE, 1 << 20), (resource.RLIMIT_NPROC, 0)):
        try:
            resource.setrlimit(res, (value, value))
        except (ValueError, OSError):
            pass
    os.chdir(workdir)
    sys.setrecursionlimit(2000)
    out = {"status": "ok", "outputs": [], "errors": [], "error": None}
    try:
        code = compile(job["code"], "<program>", "exec")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
        out.update(status="syntax_error", error=f"{type(e).__name__}: {e}"[:300])
        return out
    _install_hook(workdir, report_fd)
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(code, namespace)
        calls = job.get("calls")
        if calls is not None:
            fn = namespace.get(job.get("entry", "f"))
            if not callable(fn):
                out.update(status="runtime_error", error=f"NameError: no function {job.get('entry', 'f')!r}")
                return out
            for args in calls:
                try:
                    out["outputs"].append(_jsonable(fn(*args)))
                    out["errors"].append(None)
                except MemoryError:
                    raise
                except Exception as e:  # noqa: BLE001 - a failing call is one failed test, the others still run
                    out["outputs"].append(None)
                    out["errors"].append(type(e).__name__)
    except MemoryError:
        out.update(status="memory", error="MemoryError")
    except SystemExit as e:
        out.update(status="early_exit", error=f"SystemExit({e.code!r})"[:300])
    except RecursionError as e:
        out.update(status="runtime_error", error=f"RecursionError: {e}"[:300])
    except BaseException as e:  # noqa: BLE001 - whatever the program raised is its own failure
        out.update(status="runtime_error", error=f"{type(e).__name__}: {e}"[:300])
    return out


def _read_until(fd: int, deadline: float) -> tuple[bytes, bool]:
    """Everything the child writes until it closes the pipe, or (partial, True) when the deadline passes."""
    chunks, size = [], 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return b"".join(chunks), True
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        data = os.read(fd, 65536)
        if not data:
            return b"".join(chunks), False
        size += len(data)
        if size > MAX_RESULT_BYTES:
            return b"", False
        chunks.append(data)


def run_one(job: dict, timeout_s: float, memory_mb: int) -> dict:
    started = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="evo-prog-")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run, report, leave without running any cleanup of the worker
        os.close(r)
        try:
            result = _run_in_child(job, workdir, memory_mb, max(1, int(timeout_s + 1)), w)
        except BaseException as e:  # noqa: BLE001
            result = {"status": "crash", "error": f"{type(e).__name__}: {e}"[:300]}
        try:
            _send(w, "R", result)
        finally:
            os._exit(0)
    os.close(w)
    try:
        raw, timed_out = _read_until(r, started + timeout_s)
    finally:
        os.close(r)
        try:
            os.killpg(pid, signal.SIGKILL)  # the program and anything it managed to start
        except (ProcessLookupError, PermissionError):
            pass
        _, status = os.waitpid(pid, 0)
        shutil.rmtree(workdir, ignore_errors=True)
    seconds = round(time.monotonic() - started, 4)
    result, violations = None, []
    for line in raw.splitlines():
        kind, _, payload = line.partition(b" ")
        try:
            value = json.loads(payload)
        except ValueError:
            continue
        if kind == b"V" and len(violations) < 20:
            violations.append(value)
        elif kind == b"R" and result is None and isinstance(value, dict):
            result = value
    if result is None:  # the child died before reporting: os._exit, a signal, the CPU or memory limit
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            kind = "timeout" if sig == signal.SIGXCPU else "crash"
            result = {"status": kind, "error": f"killed by {signal.Signals(sig).name}"}
        else:
            result = {"status": "early_exit", "error": f"exited with code {os.WEXITSTATUS(status)} before reporting"}
    if timed_out:
        result = {"status": "timeout", "error": f"no result within {timeout_s:g} s"}
    result["violations"] = violations
    if violations and result.get("status") in ("ok", "runtime_error", "early_exit", "crash"):
        result["status"] = "forbidden"
    result["seconds"] = seconds
    return result


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when workers stop
    for line in sys.stdin:
        batch = json.loads(line)
        results = [run_one(job, batch["timeout_s"], batch["memory_mb"]) for job in batch["jobs"]]
        sys.stdout.write(json.dumps(results) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
