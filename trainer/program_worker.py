"""A program-execution worker: runs untrusted programs one by one, each in a forked, limited child.

Started by `evotrainer.trainer.execution.ProgramPool` as `python -I -S program_worker.py` (isolated mode, no
site-packages: this file imports only the standard library, so the worker stays small and a fork of it is
cheap), under bubblewrap where the machine has it. It reads one JSON batch per line on stdin and answers one
JSON line on stdout, `{"id": <the batch's id>, "results": [one per job]}`.

Per program, the child that runs it:
- gets its own process group (killed as a whole afterwards, so a forked grandchild dies too),
  an address-space limit, a CPU-time limit, a file-size limit, no core dumps;
- has /dev/null as stdin, stdout and stderr and no descriptor but its own channel to its caller: it cannot
  write into the worker's answer or into another program's channel;
- runs in a fresh temporary directory (removed afterwards);
- runs under an audit hook that refuses, and records as a violation: process creation (fork, exec,
  system, spawn, subprocess), signals to other processes, sockets, ctypes, raising resource limits,
  changing directory, writing or deleting outside its directory, and reading files outside the
  standard library and its directory (the hidden tests and the repository are not readable);
- never sees expected outputs.

A program shares its interpreter with the code that reports for it and can read or call anything in it
(frames, module globals, this file's functions, its channel). So what that child sends is only ever taken as
the program's own answers, never as a verdict:
- a function job (`code`, `calls`, `entry`): the child sends the values the program returned in one `R`
  message and the caller compares them with expected values it never sent. A forged message can only claim
  answers, which returning them does as well. A second result message or a malformed line is a `crash`; no
  result (an `os._exit`) is an `early_exit`.
- a check job (`code`, `check`, `entry`; HumanEval): the expected values are in the check's code, so the two
  never share a process. The program runs in a fresh interpreter (exec'd: the worker's memory with this batch
  is not in it) that is handed its own code only and answers calls; the check runs in a forked checker that
  holds no untrusted code and calls the program through a proxy, which returns plain values rebuilt from data
  (int, float, bool, str, None, list, tuple, dict, set: never an object of the program's, with an `__eq__` of
  its own) or raises the program's failure. The checker's result is the verdict. A batch never mixes check
  jobs with others (the pool splits it), so no forked program finds a check in the worker's memory.
- a script job (`code` only): `ok` when the program ends without an exception, as the program reports it: a
  claim it can forge, so nothing hidden is graded this way.

The worker waits for each result with a wall-clock deadline and kills the process groups when it passes.
Statuses: ok, syntax_error, runtime_error, timeout, memory, forbidden, early_exit, crash.
"""

import fcntl
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
MAX_VIOLATIONS = 20
MAX_INT_BITS = 8192  # a plain int in an answer: about 2,500 digits (Python refuses to print past 4,300)
STATUSES = ("ok", "syntax_error", "runtime_error", "timeout", "memory", "forbidden", "early_exit", "crash")
SELF = os.path.abspath(__file__)

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


_TAGS = {"l": list, "t": tuple, "s": set, "d": dict}


def _encode(value, depth: int = 0):
    """A tree of plain built-in values (exact types) as JSON data, containers as `[tag, *items]`; TypeError for
    anything else. Run by the program's process: it only says what the program answered."""
    t = type(value)
    if value is None or t is bool or t is float or t is str or (t is int and value.bit_length() <= MAX_INT_BITS):
        return value
    if t is int:
        raise TypeError(f"an int over {MAX_INT_BITS} bits")
    tag = next((k for k, c in _TAGS.items() if c is t), None)
    if tag is None or depth >= 100:
        raise TypeError(f"a {t.__name__} is not a plain value (int, float, bool, str, None, list, tuple, dict, set)")
    items = [x for kv in value.items() for x in kv] if t is dict else value
    return [tag, *(_encode(v, depth + 1) for v in items)]


def _decode(data, depth: int = 0):
    """The plain value that `_encode` wrote, built here from JSON data; ValueError or TypeError for anything else."""
    t = type(data)
    if data is None or t is bool or t is int or t is float or t is str:
        return data
    if t is not list or not data or type(data[0]) is not str or data[0] not in _TAGS or depth >= 100:
        raise ValueError("not a plain value")
    items = [_decode(v, depth + 1) for v in data[1:]]
    if data[0] == "d":
        if len(items) % 2:
            raise ValueError("a dict with a key and no value")
        return dict(zip(items[::2], items[1::2]))
    return _TAGS[data[0]](items)


def _send(fd: int, kind: str, payload) -> None:
    """One framed line: `V <json>` a violation, `R <json>` a result or answer, `J`/`C` a job or call."""
    view = memoryview(f"{kind} {json.dumps(payload)}\n".encode())
    while view:
        view = view[os.write(fd, view):]


class _Lines:
    """The framed lines arriving on a pipe, each at most MAX_RESULT_BYTES (ValueError past that)."""

    def __init__(self, fd: int):
        self.fd, self.buf = fd, bytearray()

    def next(self) -> bytes | None:
        """The next line without its newline; None at the end of the pipe."""
        while (i := self.buf.find(b"\n")) < 0:
            if len(self.buf) > MAX_RESULT_BYTES:
                raise ValueError(f"a message over {MAX_RESULT_BYTES} bytes")
            data = os.read(self.fd, 65536)
            if not data:
                return None
            self.buf += data
        line = bytes(self.buf[:i])
        del self.buf[:i + 1]
        return line


def _text(e: BaseException) -> str:
    try:
        return f"{type(e).__name__}: {e}"[:300]
    except Exception:  # noqa: BLE001 - a hostile __str__
        return type(e).__name__


def _failure(e: BaseException) -> dict:
    """What an exception out of the program makes of its run."""
    if isinstance(e, MemoryError):
        return {"status": "memory", "error": "MemoryError"}
    if isinstance(e, SystemExit):
        return {"status": "early_exit", "error": f"SystemExit({e.code!r})"[:300]}
    return {"status": "runtime_error", "error": _text(e)}


def _limit(memory_mb: int, cpu_s: int) -> None:
    """The child's own process group and its limits, set before any untrusted code runs."""
    os.setpgid(0, 0)
    mem = memory_mb << 20
    for res, value in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_CORE, 0),
                       (resource.RLIMIT_FSIZE, 1 << 20), (resource.RLIMIT_NPROC, 0)):
        try:
            resource.setrlimit(res, (value, value))
        except (ValueError, OSError):
            pass


def _isolate_fds(keep: list[int]) -> list[int]:
    """/dev/null as stdin, stdout and stderr; the descriptors of `keep` moved to 3, 4, ... in order; every other
    descriptor closed (the worker's stdin and stdout above all). Returns the new numbers."""
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in keep]  # out of the way of the renumbering
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    for i, fd in enumerate(high):
        os.dup2(fd, 3 + i)
    os.closerange(3 + len(keep), max(os.sysconf("SC_OPEN_MAX"), 64 + len(keep)))
    return list(range(3, 3 + len(keep)))


def _compile(code: str):
    """The program's code object, or the syntax_error result."""
    try:
        return compile(code, "<program>", "exec"), None
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
        return None, {"status": "syntax_error", "error": f"{type(e).__name__}: {e}"[:300]}


def _run_program(job: dict, workdir: str, report_fd: int) -> dict:
    """In the forked child of a function or script job: define the program, call its entry on every argument
    list; the program's answers."""
    os.chdir(workdir)
    sys.setrecursionlimit(2000)
    out = {"status": "ok", "outputs": [], "errors": [], "error": None}
    code, failed = _compile(job["code"])
    if failed:
        return {**out, **failed}
    _install_hook(workdir, report_fd)
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(code, namespace)
        calls = job.get("calls")
        if calls is not None:
            fn = namespace.get(job.get("entry", "f"))
            if not callable(fn):
                return {**out, "status": "runtime_error", "error": f"NameError: no function {job.get('entry', 'f')!r}"}
            for args in calls:
                try:
                    out["outputs"].append(_jsonable(fn(*args)))
                    out["errors"].append(None)
                except MemoryError:
                    raise
                except Exception as e:  # noqa: BLE001 - a failing call is one failed test, the others still run
                    out["outputs"].append(None)
                    out["errors"].append(type(e).__name__)
    except BaseException as e:  # noqa: BLE001 - whatever the program raised is its own failure
        out.update(_failure(e))
    return out


def _serve_candidate() -> None:
    """A check job's program, in a fresh interpreter (`--candidate`, cwd its directory): read its code on fd 3,
    define it, then answer every call (`C [args, kwargs]`) with the returned value as plain data on fd 4."""
    requests, replies = _Lines(3), 4
    line = requests.next()
    if line is None:
        return
    job = json.loads(line.partition(b" ")[2])
    sys.setrecursionlimit(2000)
    code, failed = _compile(job["code"])
    if failed:
        _send(replies, "R", failed)
        return
    _install_hook(os.getcwd(), replies)
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(code, namespace)
        fn = namespace.get(job["entry"])
        ready = {"status": "ok"} if callable(fn) else {"status": "runtime_error",
                                                        "error": f"NameError: no function {job['entry']!r}"}
    except BaseException as e:  # noqa: BLE001
        ready = _failure(e)
    _send(replies, "R", ready)
    while ready["status"] == "ok" and (line := requests.next()) is not None:
        try:
            args, kwargs = _decode(json.loads(line.partition(b" ")[2]))
            reply = {"value": _encode(fn(*args, **kwargs))}
        except BaseException as e:  # noqa: BLE001 - the call failed: the check fails with it
            reply = _failure(e)
        _send(replies, "R", reply)


class _CandidateFailed(BaseException):
    """The program raised, exited, or answered with something that is not a plain value. A BaseException: a
    check's own `except Exception` does not swallow it."""

    def __init__(self, status, error):
        super().__init__(error)
        if status in STATUSES and status != "ok":
            self.status, self.error = status, error[:300] if isinstance(error, str) else None
        else:
            self.status, self.error = "crash", "a malformed answer from the program"


class _CandidateGone(BaseException):
    """The program's process ended (os._exit, a signal, its CPU limit) or closed its channel."""


def _run_check(job: dict, requests: int, replies_fd: int) -> dict:
    """In the forked checker: hand the program its code, then run the job's `check(candidate)` with a proxy that
    calls the program in its own process. Only the answers cross; the verdict is made here."""
    replies, violations = _Lines(replies_fd), []

    def reply() -> dict:
        while True:
            try:
                line = replies.next()
            except ValueError as e:
                raise _CandidateFailed("runtime_error", str(e)) from None
            if line is None:
                raise _CandidateGone
            kind, _, payload = line.partition(b" ")
            try:
                value = json.loads(payload)
            except (ValueError, RecursionError):
                value = None
            if kind == b"V" and isinstance(value, str):
                if len(violations) < MAX_VIOLATIONS:
                    violations.append(value[:200])
            elif kind == b"R" and isinstance(value, dict):
                return value
            else:
                raise _CandidateFailed("crash", "a malformed message from the program")

    def candidate(*args, **kwargs):
        try:
            _send(requests, "C", _encode((list(args), kwargs)))
        except BrokenPipeError:
            raise _CandidateGone from None
        answer = reply()
        if "value" not in answer:
            raise _CandidateFailed(answer.get("status"), answer.get("error"))
        try:
            return _decode(answer["value"])
        except (ValueError, TypeError, RecursionError):
            raise _CandidateFailed("runtime_error", "an answer that is not a plain value") from None

    namespace = {"__name__": "__check__"}
    exec(compile(job["check"], "<check>", "exec"), namespace)  # trusted: the task's own test code
    check = namespace["check"]
    try:
        _send(requests, "J", {"code": job["code"], "entry": job["entry"]})
        ready = reply()
        if ready.get("status") != "ok":
            raise _CandidateFailed(ready.get("status"), ready.get("error"))
        namespace[job["entry"]] = candidate
        check(candidate)
        out = {"status": "ok", "error": None}
    except _CandidateFailed as e:
        out = {"status": e.status, "error": e.error}
    except (_CandidateGone, BrokenPipeError):
        out = {"status": "early_exit", "error": None, "gone": True}
    except BaseException as e:  # noqa: BLE001 - a failed assert, or the check failing on an answer: a failed test
        out = {"status": "runtime_error", "error": _text(e)}
    return {**out, "violations": violations}


def _fork(child) -> int:
    """A child in its own process group that runs `child()` and never returns into the worker's loop."""
    pid = os.fork()
    if pid == 0:
        try:
            child()
        finally:
            os._exit(0)
    try:
        os.setpgid(pid, pid)  # here as well as in the child: a kill right after the fork reaches its group
    except OSError:
        pass
    return pid


def _reap(pid: int, status: int | None = None) -> int:
    """Kill a child's process group (the program and anything it managed to start); its wait status."""
    if status is not None:  # already waited for: the pid may belong to someone else now
        return status
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return os.waitpid(pid, 0)[1]


def _exit_status(pid: int, deadline: float) -> int | None:
    """The wait status of a child that is ending by itself, or None when it still runs at the deadline."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            return None
        time.sleep(0.002)


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
            return b"R {\"status\": \"crash\", \"error\": \"a result over the size limit\"}\n", False
        chunks.append(data)


def _messages(raw: bytes) -> tuple[dict | None, list[str]]:
    """The one result and the violations a child sent. A line after the result, a second result or any
    malformed line make the result a crash: the channel carries data, never a second voice."""
    result, violations = None, []
    lines = raw.split(b"\n")
    for line in lines[:-1]:
        kind, _, payload = line.partition(b" ")
        try:
            value = json.loads(payload)
        except (ValueError, RecursionError):
            value = None
        if kind == b"V" and isinstance(value, str) and result is None:
            if len(violations) < MAX_VIOLATIONS:
                violations.append(value[:200])
        elif kind == b"R" and isinstance(value, dict) and result is None:
            result = value
        else:
            return {"status": "crash", "error": "a malformed or second message after the program ran"}, violations
    if lines[-1]:
        return {"status": "crash", "error": "an unfinished message"}, violations
    return result, violations


def _answers(value: dict, calls: list | None) -> dict | None:
    """A function or script child's result as the caller may read it, or None when it is not one."""
    status, outputs, errors, error = value.get("status"), value.get("outputs", []), value.get("errors", []), \
        value.get("error")
    n = len(calls or ())
    if (status not in STATUSES or type(outputs) is not list or type(errors) is not list
            or len(outputs) != len(errors) or len(outputs) > n or (status == "ok" and len(outputs) != n)
            or not all(e is None or type(e) is str for e in [error, *errors])):
        return None
    return {"status": status, "outputs": outputs, "errors": errors, "error": error}


def _died(status: int) -> dict:
    """The result of a child that ended without reporting."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return {"status": "timeout" if sig == signal.SIGXCPU else "crash",
                "error": f"killed by {signal.Signals(sig).name}"}
    return {"status": "early_exit", "error": f"exited with code {os.WEXITSTATUS(status)} before reporting"}


def _run_function(job: dict, workdir: str, deadline: float, memory_mb: int, cpu_s: int) -> tuple[dict, list, bool]:
    r, w = os.pipe()

    def child() -> None:
        _limit(memory_mb, cpu_s)
        (report,) = _isolate_fds([w])
        try:
            result = _run_program(job, workdir, report)
        except BaseException as e:  # noqa: BLE001
            result = {"status": "crash", "error": _text(e)}
        _send(report, "R", result)

    pid = _fork(child)
    os.close(w)
    try:
        raw, timed_out = _read_until(r, deadline)
    finally:
        os.close(r)
        status = _reap(pid)
    result, violations = _messages(raw)
    if result is not None:
        result = _answers(result, job.get("calls")) or {"status": "crash", "error": "a malformed result"}
    return result or _died(status), violations, timed_out


def _run_checked(job: dict, workdir: str, deadline: float, memory_mb: int, cpu_s: int) -> tuple[dict, list, bool]:
    to_program, to_program_w = os.pipe()
    from_program, from_program_w = os.pipe()
    r, w = os.pipe()

    def program() -> None:
        _limit(memory_mb, cpu_s)
        os.chdir(workdir)
        _isolate_fds([to_program, from_program_w])
        os.execv(sys.executable, [sys.executable, "-I", "-S", SELF, "--candidate"])

    def checker() -> None:
        _limit(memory_mb, cpu_s)
        requests, replies, report = _isolate_fds([to_program_w, from_program, w])
        try:
            result = _run_check(job, requests, replies)
        except BaseException as e:  # noqa: BLE001 - the check itself does not run: not the program's failure
            result = {"status": "crash", "error": f"the check does not run: {_text(e)}"}
        _send(report, "R", result)

    pids = [_fork(program), _fork(checker)]
    for fd in (to_program, to_program_w, from_program, from_program_w, w):
        os.close(fd)
    program_status, violations = None, []
    try:
        raw, timed_out = _read_until(r, deadline)
        verdict, _ = _messages(raw)
        result = {"status": "crash", "error": "the checker ended without a verdict"}
        if verdict is not None and verdict.get("status") in STATUSES:
            result = {"status": verdict["status"], "error": verdict.get("error")}
            violations = [v for v in verdict.get("violations") or [] if isinstance(v, str)]
        if verdict is not None and verdict.get("gone"):  # the program ended: how it ended is the status
            program_status = _exit_status(pids[0], deadline)
            timed_out = timed_out or program_status is None
            result = _died(program_status) if program_status is not None else result
    finally:
        os.close(r)
        _reap(pids[0], program_status)
        _reap(pids[1])
    return result, violations, timed_out


def run_one(job: dict, timeout_s: float, memory_mb: int) -> dict:
    """The result of one job: its status, the program's answers (function jobs), violations, seconds."""
    started = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="evo-prog-")
    run = _run_checked if "check" in job else _run_function
    try:
        result, violations, timed_out = run(job, workdir, started + timeout_s, memory_mb, max(1, int(timeout_s + 1)))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if timed_out:
        result = {"status": "timeout", "error": f"no result within {timeout_s:g} s"}
    result["violations"] = violations
    if violations and result.get("status") in ("ok", "runtime_error", "early_exit", "crash"):
        result["status"] = "forbidden"
    result["seconds"] = round(time.monotonic() - started, 4)
    return result


def main() -> None:
    if sys.argv[1:] == ["--candidate"]:
        _serve_candidate()
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when workers stop
    for line in sys.stdin:  # results are not kept in a variable: the next batch's programs cannot find them
        batch = json.loads(line)
        sys.stdout.write(json.dumps({"id": batch.get("id"), "results": [
            run_one(job, batch["timeout_s"], batch["memory_mb"]) for job in batch["jobs"]]}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
