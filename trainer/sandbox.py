"""The one way harness code and training run: a child process with limits, isolated by bubblewrap.

Every child gets a wall-clock timeout, an address-space limit, a CPU-time limit (see `Limits`), a working
directory, and an environment with API keys and tokens removed. It reports progress as JSON
lines on stdout (prefix `PROGRESS_PREFIX`), everything else goes to a log file (capped). The result is a
typed `ChildResult`: ok, or failed with a reason of timeout / memory / crash / error, and the tail
of the child's log. A failing child never takes the parent down.

A child that imports or runs harness code is given an `Isolation` (DESIGN §5) and starts under bubblewrap:
a root built from the system's read-only directories, the Python installation and the package's code
with the sealed side (the domains: task sources, splits, scorers, `sealed.json`) masked; the job's inputs
read-only, its own output directories the only writable places; a fresh `/tmp`, its own PID, network, IPC
and UTS namespaces, a new session, `--die-with-parent`, and an environment of a few named variables. It
cannot see the orchestrator's processes, files, environment or other runs. Without `bwrap` such a child is
refused, unless the user sets `EVOTRAINER_UNSAFE_NO_ISOLATION=1` (recorded by the run as `isolation: none`).
"""

from __future__ import annotations

import glob
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
from functools import cache, lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from evotrainer.base.errors import UserError
from evotrainer.base.settings import OFFLINE_ENV

PROGRESS_PREFIX = "@evotrainer-progress "
CPU_KEY = "_cpu_seconds"  # the progress event a child ends with (`launch.py`), read by run_module, never shown
_isolated_cpu = [0.0]  # CPU seconds reported by this process's isolated children (isolated_cpu_seconds)
_cpu_lock = threading.Lock()


def isolated_cpu_seconds() -> float:
    """CPU seconds of this process's isolated children: what `getrusage(RUSAGE_CHILDREN)` misses (it counts the
    children that run without bubblewrap). Counted by each child's cgroup where one could be made (`ChildGroups`),
    else the child's own report at its end, which code the child ran could misstate; a statistic, never a decision."""
    with _cpu_lock:
        return _isolated_cpu[0]
SECRET_ENV = re.compile(r"(API_KEY|_TOKEN|SECRET|PASSWORD|CREDENTIAL|^AWS_|^HF_TOKEN)", re.IGNORECASE)


class Limits(BaseModel):
    """What a child may spend. Two limits on time: `cpu_s`, the CPU seconds of the child and everything it starts
    (counted by a cgroup where one can be made, `ChildGroups`; per process by RLIMIT_CPU everywhere), which stops a
    busy child whatever else the machine runs; and `timeout_s`, the wall clock, which stops one that waits or
    sleeps. A job whose verdict must not depend on the machine's load (a candidate's replay, its validation) sets
    `cpu_s` to its budget and `timeout_s` to a wide backstop: on a machine running four trainings on two cores the
    same harness passes or fails the same way."""

    timeout_s: float = 3600.0
    memory_mb: int = 16_000  # address space; torch maps a few GB of virtual memory at import
    max_tasks: int = 512  # processes and threads of an isolated child (where a pids cgroup can be made)
    cpu_s: int | None = None  # the child's CPU seconds in all; by default never before the wall clock (cpu_limit)
    network: bool = False  # False: an empty network namespace where the OS allows one (see network_isolation)
    log_mb: int = 64  # the child's output kept in its log; the rest is dropped (a flood cannot fill the disk)

    def cpu_limit(self) -> int:
        """`cpu_s`, or where unset twice the wall clock on every core: a training child's ranks and threads on a
        16-core machine spend 16 CPU seconds a second, and a limit of the whole child must not stop them early."""
        return int(self.cpu_s or 2 * self.timeout_s * (os.cpu_count() or 1))

    @classmethod
    def by_cpu(cls, cpu_s: int, **fields) -> Limits:
        """Limits for a job whose verdict must not depend on the machine's load: its CPU seconds decide, and the wall
        clock, three times that, only stops a child that waits (a busy child there has had a third of a core)."""
        return cls(cpu_s=cpu_s, timeout_s=3 * cpu_s, **fields)


class Isolation(BaseModel):
    """What an isolated child may see: its inputs read-only, its outputs writable, nothing else of the machine's
    files but the system, the Python installation and the package's code (without the sealed side)."""

    read: list[str] = []  # job inputs: the harness worktree, a checkpoint, spec and data files, evidence
    write: list[str] = []  # the job's own output directories: the only places it can write
    tmp_mb: int = 2048  # size of its private /tmp
    gpu: bool = False  # the machine's NVIDIA device files (and driver info) in view: a training job on a GPU


UNSAFE_ENV = "EVOTRAINER_UNSAFE_NO_ISOLATION"
ISOLATED_ENV = "EVOTRAINER_ISOLATED"  # set in every isolated child
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc")
# The only variables an isolated child inherits (secrets are removed from these too); HOME is its own /tmp.
CHILD_ENV = re.compile(r"^(LANG|LC_[A-Z]+|TZ|PYTHONHASHSEED|OMP_NUM_THREADS|MKL_NUM_THREADS|OPENBLAS_[A-Z0-9_]+|"
                       r"CUDA_VISIBLE_DEVICES|NCCL_[A-Z0-9_]+|EVOTRAINER_[A-Z0-9_]+)$")


class IsolationError(UserError):
    """Harness code cannot be run isolated here, and the user did not opt out."""


def isolation_mode() -> str:
    """How harness children are isolated on this machine: 'bwrap', or 'none' when the user opted out."""
    if os.environ.get(UNSAFE_ENV) == "1":
        return "none"
    if not shutil.which("bwrap"):
        raise IsolationError("bubblewrap (bwrap) is needed to run harness code isolated and is not installed: "
                             "run `make install` as root or `apt-get install bubblewrap`; to run harness code "
                             f"unisolated at your own risk, set {UNSAFE_ENV}=1")
    return "bwrap"


@lru_cache(maxsize=1)
def sealed_dirs() -> tuple[str, ...]:
    """The package directories an isolated child never sees: the domains (task sources, splits, scorers)."""
    import importlib.util

    spec = importlib.util.find_spec("evotrainer.trainer.domains")
    return tuple(str(Path(p).resolve()) for p in spec.submodule_search_locations)


@lru_cache(maxsize=1)
def _code_dirs() -> tuple[str, ...]:
    """What Python needs to start: the interpreter's prefix, the environment's, sys.path, the package's code."""
    import importlib.util

    prefixes = (sys.base_prefix, sys.prefix, str(Path(sys.executable).resolve().parent.parent))
    paths = set(prefixes)
    # sys.path beyond the installation (a test runner's rootdir, the current directory) is not the child's
    paths.update(p for p in sys.path if p and Path(p).exists() and any(p.startswith(x) for x in prefixes))
    for name in ("evotrainer", "evotrainer.base", "evotrainer.agents", "evotrainer.graph", "evotrainer.trainer",
                 "evotrainer.memory", "evotrainer.workspaces"):
        spec = importlib.util.find_spec(name)
        paths.update(spec.submodule_search_locations or ())
    resolved = sorted({str(Path(p).resolve()) for p in paths})
    # a directory inside another one already bound needs no bind of its own
    return tuple(p for p in resolved if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in resolved))


def _isolated_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if CHILD_ENV.match(k) and not SECRET_ENV.search(k)}
    env.update(OFFLINE_ENV)
    env.update({"PYTHONUNBUFFERED": "1", "HOME": "/tmp", "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
                "LANG": env.get("LANG", "C.UTF-8"), ISOLATED_ENV: "1"})
    return env


def inside_isolation() -> bool:
    """Whether this process is an isolated child (its own children are isolated with it: no nesting)."""
    return os.environ.get(ISOLATED_ENV) == "1"


def bwrap_prefix(iso: Isolation, *, cwd: str | Path, network: bool = False) -> list[str]:
    """The bubblewrap command line that starts a program in `iso`'s view (see the module docstring)."""
    # no capabilities: as root, bubblewrap would otherwise leave the child able to unmount a mask or remount a bind
    cmd = ["bwrap", "--die-with-parent", "--new-session", "--unshare-all", "--cap-drop", "ALL", "--clearenv"]
    if network:
        cmd.append("--share-net")
    for k, v in sorted(_isolated_env().items()):
        cmd += ["--setenv", k, v]
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            cmd += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            cmd += ["--ro-bind", d, d]
    for d in _code_dirs():
        cmd += ["--ro-bind", d, d]
    cmd += ["--dev", "/dev", "--proc", "/proc", "--size", str(iso.tmp_mb * 1024 * 1024), "--tmpfs", "/tmp"]
    if iso.gpu:  # CUDA opens /dev/nvidia{ctl,-uvm,-uvm-tools,0..N} and reads /proc/driver/nvidia; NCCL reads /sys
        for dev in sorted(glob.glob("/dev/nvidia*")):
            cmd += ["--dev-bind", dev, dev]
        if os.path.isdir("/proc/driver/nvidia"):
            cmd += ["--ro-bind", "/proc/driver/nvidia", "/proc/driver/nvidia"]
        # NCCL (ranks on several GPUs, `train --processes`) reads the PCI topology under /sys; read-only, no data there
        cmd += ["--ro-bind", "/sys", "/sys"]
    for p in iso.read:
        cmd += ["--ro-bind", str(Path(p).resolve()), str(Path(p).resolve())]
    for p in iso.write:
        Path(p).mkdir(parents=True, exist_ok=True)
        cmd += ["--bind", str(Path(p).resolve()), str(Path(p).resolve())]
    masks = list(sealed_dirs())
    # a checkpoint's cached sealed evaluations (dev/test items and grades) are never in view
    masks += [str(Path(p).resolve() / "evals") for p in iso.read if (Path(p) / "evals").is_dir()]
    for m in masks:
        cmd += ["--tmpfs", m, "--remount-ro", m]
    # the directories bubblewrap made to hold the binds are read-only too (a private /tmp stays writable)
    return [*cmd, "--remount-ro", "/", "--chdir", str(Path(cwd).resolve()), "--"]


@lru_cache(maxsize=1)
def _netns_prefix() -> tuple[str, ...]:
    """The command prefix that puts a child in an empty network namespace here, or () where none works."""
    unshare = shutil.which("unshare")  # absolute: the answer is cached, the PATH of a later call may differ
    if not unshare:
        return ()
    for flags in ("-n", "-rn"):  # as root; else through a user namespace
        try:
            if subprocess.run([unshare, flags, "true"], capture_output=True, timeout=10).returncode == 0:
                return (unshare, flags, "--")
        except (OSError, subprocess.TimeoutExpired):
            pass
    return ()


def network_isolation() -> bool:
    """Whether children can be put in an empty network namespace on this machine."""
    return bool(_netns_prefix())


def _isolation_prefix(limits: Limits, isolation: Isolation | None, cwd: str | Path) -> list[str]:
    if isolation is not None and isolation_mode() == "bwrap":
        return bwrap_prefix(isolation, cwd=cwd, network=limits.network)
    return [] if limits.network else list(_netns_prefix())


class ChildResult(BaseModel):
    ok: bool
    reason: Literal["ok", "timeout", "memory", "crash", "error"]
    returncode: int | None
    seconds: float
    log_tail: str = ""
    message: str = ""  # one line: what went wrong, for the user
    cpu_seconds: float | None = None  # the child's and its children's, counted by its cgroup (else self-reported)


def progress(**fields) -> None:
    """Called in a child: one progress event for the parent's display."""
    print(PROGRESS_PREFIX + json.dumps(fields), flush=True)


def child_main(entry: Callable[[list[str]], int]) -> None:
    """Run a child's entry point: bad input (a UserError) becomes one `UserError: <sentence>` line on stderr and
    exit code 3, which the parent (`jobs.run_child`) turns back into the same error."""
    try:
        code = entry(sys.argv[1:])
    except UserError as e:
        print(f"UserError: {' '.join(str(e).split())}", file=sys.stderr, flush=True)
        code = 3
    sys.exit(code)


def serve_spec(spec_type, compute: Callable) -> None:
    """The child side of `jobs.call_child`: read the spec named on the command line (a `spec_type` with a
    `result_path`), write `compute(spec)` (a pydantic model) there; bad input becomes the parent's UserError."""
    def entry(argv: list[str]) -> int:
        spec = spec_type.model_validate_json(Path(argv[0]).read_text())
        Path(spec.result_path).write_text(compute(spec).model_dump_json())
        return 0
    child_main(entry)


def child_env() -> dict[str, str]:
    """The parent's environment without secrets, plus the offline switches (DESIGN §10)."""
    env = {k: v for k, v in os.environ.items() if not SECRET_ENV.search(k)}
    env.update(OFFLINE_ENV)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _libc_prctl():
    """libc's prctl, looked up here in the parent: a forked child of a threaded parent must not import."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _libc_prctl()


def _die_with_parent(parent: int) -> None:
    """Linux: the child gets SIGKILL when the thread that started it dies, so a killed orchestrator leaves no
    training running behind it (a resumed run would otherwise race an orphan for the same directory). A parent
    killed between the fork and this call sends no signal: the child sees it has been re-parented and exits."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


CGROUP_V1 = Path("/sys/fs/cgroup")  # where cgroup v1 mounts its controllers (pids, cpuacct), on machines that have it


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


@cache
def _sweep(parent: Path) -> None:
    """Remove the empty groups that earlier processes left under `parent` (a killed orchestrator never removes
    its own); once per process and hierarchy. A group still in use is not empty, and rmdir refuses it."""
    for g in parent.glob("evotrainer-*"):
        try:
            if not _alive(int(g.name.split("-")[1])):
                g.rmdir()
        except (ValueError, IndexError, OSError):
            pass


def _cgroup2_own() -> Path | None:
    """This process's own group in the cgroup v2 hierarchy (where one is mounted), under which a child group may be
    made: a group that holds processes has no controllers for its children, so the child group is a legal place."""
    try:
        mount = next(line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
                     if " - cgroup2 " in line)
        own = next(line[3:] for line in Path("/proc/self/cgroup").read_text().splitlines() if line.startswith("0::"))
    except (OSError, StopIteration):
        return None
    return Path(mount) / own.strip().lstrip("/")


class ChildGroups:
    """The control groups one child starts in, where this process may make them (as root, with a cgroup file
    system): a pids group that caps the child's processes and threads (a fork bomb stops there; RLIMIT_NPROC does
    not bind root), and a CPU accounting group that counts the CPU time of everything the child starts,
    bubblewrap's PID namespace included: what `Limits.cpu_s` decides on, measured here, not reported by the
    child. Without them the child still has RLIMIT_CPU per process and the wall-clock limit."""

    def __init__(self, max_tasks: int | None):
        self.made: list[Path] = []
        self.usage: Path | None = None  # cpuacct.usage (v1, nanoseconds) or cpu.stat (v2, usage_usec)
        self.name = f"evotrainer-{os.getpid()}-{time.monotonic_ns()}"
        if max_tasks is not None:
            self._make(CGROUP_V1 / "pids", {"pids.max": str(max_tasks)})
        if (g := self._make(CGROUP_V1 / "cpuacct", {})) is not None:
            self.usage = g / "cpuacct.usage"
        elif (own := _cgroup2_own()) is not None and (g := self._make(own, {})) is not None:
            self.usage = g / "cpu.stat"

    def _make(self, parent: Path, settings: dict[str, str]) -> Path | None:
        if not (parent / "cgroup.procs").is_file() or not os.access(parent, os.W_OK):
            return None
        _sweep(parent)
        path = parent / self.name
        try:
            path.mkdir()
        except OSError:
            return None
        try:
            for key, value in settings.items():
                (path / key).write_text(value)
        except OSError:
            path.rmdir()
            return None
        self.made.append(path)
        return path

    def join(self) -> None:
        """Called in the child between fork and exec: move it into every group (what it starts stays there). The
        pids group is a cap, so a failed move fails the start; the accounting group is a count, and a failed move
        only leaves it at zero (RLIMIT_CPU and the wall clock still hold)."""
        for path in self.made:
            try:
                with open(path / "cgroup.procs", "w") as f:
                    f.write(str(os.getpid()))
            except OSError:
                if path.parent.name == "pids":
                    raise

    def cpu_seconds(self) -> float | None:
        """CPU seconds the child and everything it started have used so far, or None where nothing counts them."""
        try:
            text = self.usage.read_text()  # type: ignore[union-attr]
            if self.usage.name == "cpuacct.usage":  # type: ignore[union-attr]
                return int(text) / 1e9
            return int(dict(line.split() for line in text.splitlines())["usage_usec"]) / 1e6
        except (AttributeError, OSError, ValueError, KeyError):
            return None

    def remove(self) -> None:
        for path in self.made:
            for _ in range(50):  # empty once the child's processes are reaped
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


def _limit(limits: Limits, groups: ChildGroups) -> Callable[[], None]:
    parent = os.getpid()

    def apply() -> None:
        os.setsid()  # own process group: a timeout kills the child and anything it started
        groups.join()
        _die_with_parent(parent)
        mem = limits.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        cpu = limits.cpu_limit()
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))  # per process; the group's sum: the watchdog
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
               on_progress: Callable[[dict], None] | None = None, label: str = "child",
               isolation: Isolation | None = None) -> ChildResult:
    """Run `python -m module args...` under `limits` in `cwd`; stream progress events to `on_progress`.
    With `isolation` (a child that runs harness code) it starts under bubblewrap in that view."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    prefix = _isolation_prefix(limits, isolation, cwd)
    isolated = prefix[:1] == ["bwrap"]
    groups = ChildGroups(limits.max_tasks if isolated else None)
    started, reported, cpu_limit = time.time(), None, limits.cpu_limit()
    with open(log_path, "a", buffering=1, errors="replace") as log:  # line by line: `tail -f` follows a long child
        # stderr joins stdout: the parent writes the log, so a flood is capped at limits.log_mb
        # bubblewrap itself gets only the child's few variables: /proc/1/environ inside is bwrap's
        # the lifeline (launch.py): the child holds the read end, only this process the write end
        lifeline, hold = os.pipe()
        try:
            proc = subprocess.Popen([*prefix, sys.executable, "-m", "evotrainer.trainer.launch", str(lifeline), module,
                                     *args], cwd=str(cwd),
                                    env=_isolated_env() if isolated else child_env(),
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    text=True, errors="replace", preexec_fn=_limit(limits, groups),
                                    pass_fds=(lifeline,))
        except BaseException:
            os.close(hold)
            groups.remove()
            raise
        finally:
            os.close(lifeline)
        # a watchdog, not a check between lines: a silent hung child must be stopped too
        fired: list[str] = []  # "wall" or "cpu": which limit the watchdog stopped the child at
        ended = threading.Event()

        def watch() -> None:
            deadline = time.monotonic() + limits.timeout_s
            while not ended.wait(max(0.0, min(0.5, deadline - time.monotonic()))):
                used, late = groups.cpu_seconds(), time.monotonic() >= deadline
                if late or (used is not None and used > cpu_limit):
                    fired.append("wall" if late else "cpu")  # one reading: the message names the limit that fired
                    _kill_group(proc)
                    return

        watchdog = threading.Thread(target=watch, name=f"watchdog-{label}", daemon=True)
        watchdog.start()
        room = limits.log_mb * 1024 * 1024
        try:
            for line in iter(lambda: proc.stdout.readline(1 << 16), ""):  # type: ignore[union-attr]
                if line.startswith(PROGRESS_PREFIX):
                    try:
                        event = json.loads(line[len(PROGRESS_PREFIX):])
                        if isinstance(event, dict) and CPU_KEY in event:
                            reported = float(event[CPU_KEY])
                        elif on_progress:
                            on_progress(event)
                    except (ValueError, TypeError):
                        pass  # a malformed progress line is the child's problem, never the parent's
                elif room > 0:
                    room -= len(line)
                    log.write(line if room > 0 else f"[log capped at {limits.log_mb} MB: the rest is dropped]\n")
            proc.wait()
        finally:
            ended.set()
            watchdog.join()
            if proc.poll() is None:
                _kill_group(proc)
            os.close(hold)
            measured = groups.cpu_seconds()
            groups.remove()
    rc = proc.returncode
    # what RUSAGE_CHILDREN misses (bubblewrap's PID namespace): the group's count, else the child's own report
    cpu = measured if measured is not None else reported
    if isolated and cpu is not None and cpu > 0:
        with _cpu_lock:
            _isolated_cpu[0] += cpu
    if isolated and rc is not None and rc > 128:
        rc = -(rc - 128)  # bubblewrap reports a child killed by signal N as exit status 128 + N
    tail = _tail(log_path)
    seconds = round(time.time() - started, 2)
    result = dict(returncode=rc, seconds=seconds, log_tail=tail, cpu_seconds=None if cpu is None else round(cpu, 2))
    if fired == ["cpu"] or rc == -signal.SIGXCPU:  # the group's sum, or one process's RLIMIT_CPU
        return ChildResult(ok=False, reason="timeout", **result,
                           message=f"{label}: timed out: used its {cpu_limit} CPU seconds (in {seconds:.0f} s)")
    if fired:
        spent = "" if cpu is None else f", having used {cpu:.0f} CPU seconds of its {cpu_limit}"
        return ChildResult(ok=False, reason="timeout", **result,
                           message=f"{label}: timed out after {limits.timeout_s:.0f}s{spent}")
    if rc == 0:
        return ChildResult(ok=True, reason="ok", **result)
    if rc < 0:
        sig = signal.Signals(-rc).name
        reason = "memory" if -rc == signal.SIGKILL and "MemoryError" in tail else "crash"
        return ChildResult(ok=False, reason=reason, **result, message=f"{label}: killed by {sig}")
    if "MemoryError" in tail or "std::bad_alloc" in tail or "DefaultCPUAllocator: can't allocate" in tail:
        return ChildResult(ok=False, reason="memory", **result,
                           message=f"{label}: exceeded its memory limit of {limits.memory_mb} MB")
    return ChildResult(ok=False, reason="error", **result, message=f"{label}: {_last_error(tail)}")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
