import os
import subprocess
import sys
import threading
import time

import pytest

from evotrainer.trainer.sandbox import Limits, run_module


def _module(tmp_path, name: str, body: str) -> str:
    (tmp_path / f"{name}.py").write_text(body)
    return name


def test_ok_progress_and_cwd(tmp_path):
    mod = _module(tmp_path, "okmod", "import os\nfrom evotrainer.trainer.sandbox import progress\n"
                                     "progress(step=1, total=2)\nprint('cwd', os.getcwd())\n")
    events = []
    res = run_module(mod, [], cwd=tmp_path, log_path=tmp_path / "log", limits=Limits(timeout_s=60),
                     on_progress=events.append)
    assert res.ok and events == [{"step": 1, "total": 2}]
    assert f"cwd {tmp_path}" in (tmp_path / "log").read_text()


def test_a_child_whose_parent_died_before_it_was_armed_exits():
    """The window between fork and PR_SET_PDEATHSIG: a parent killed there sends no signal, so the child checks
    that it still has the parent that started it, and exits when it has been re-parented."""
    code = "import os; from evotrainer.trainer.sandbox import _die_with_parent; _die_with_parent({}); print('alive')"
    orphan = subprocess.run([sys.executable, "-c", code.format("os.getppid() + 1")], capture_output=True, text=True)
    assert orphan.returncode == 1 and "alive" not in orphan.stdout
    kept = subprocess.run([sys.executable, "-c", code.format("os.getppid()")], capture_output=True, text=True)
    assert kept.returncode == 0 and kept.stdout.strip() == "alive"


def test_timeout_kills_a_silent_hang(tmp_path):
    """A sleeping child spends no CPU time, so only the watchdog can end it (how fast: benchmarks/bench_limits.py)."""
    mod = _module(tmp_path, "hang", "import os, time\nprint('pid', os.getpid(), flush=True)\n"
                                    "while True: time.sleep(1)\n")
    res = run_module(mod, [], cwd=tmp_path, log_path=tmp_path / "log", limits=Limits(timeout_s=2), label="cand-x")
    assert res.reason == "timeout" and not res.ok
    assert res.message.startswith("cand-x: timed out")
    pid = int((tmp_path / "log").read_text().split("pid ", 1)[1].split()[0])
    with pytest.raises(ProcessLookupError):  # killed and reaped, not left sleeping
        os.kill(pid, 0)


def _groups_count_cpu(version: int | None = None) -> bool:
    """Whether a child's CPU time is counted here (by a cgroup v1 `cpuacct` group, or v2 `cpu.stat`: `version`)."""
    from evotrainer.trainer.sandbox import ChildGroups

    groups = ChildGroups(None)
    groups.remove()
    return groups.usage is not None and version in (None, 1 if groups.usage.name == "cpuacct.usage" else 2)


BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {}: pass\n"


@pytest.mark.parametrize("version", [1, 2])
def test_the_cpu_limit_counts_every_process_the_child_starts(version, tmp_path, monkeypatch):
    """Two processes that would spend 5 CPU seconds each: RLIMIT_CPU (3 s) stops each at 3; the child's group counts
    their sum, and the watchdog stops the child at 3 in all (where a group can be made: as root, as in CI). Version
    2: with no v1 hierarchy, the group made under this process's own in the v2 one (a hybrid machine has both)."""
    from evotrainer.trainer import sandbox

    if version == 2:
        monkeypatch.setattr(sandbox, "CGROUP_V1", tmp_path / "no-cgroup-v1")
    if not _groups_count_cpu(version):
        pytest.skip(f"no cgroup v{version} group can be made here to count a child's CPU time (needs root and a "
                    "cgroup file system of that version)")
    mod = _module(tmp_path, "pair", "import os\npid = os.fork()\n" + BURN.format(5)
                  + "if pid:\n    os.waitpid(pid, 0)\n")
    res = run_module(mod, [], cwd=tmp_path, log_path=tmp_path / "log", limits=Limits(cpu_s=3, timeout_s=120),
                     label="cand-z")
    assert res.reason == "timeout" and res.message.startswith("cand-z: timed out: used its 3 CPU seconds"), res
    assert 3 <= res.cpu_seconds < 6  # stopped within a poll of the limit, not at 6 (each at its RLIMIT)


def test_waiting_does_not_count_against_the_cpu_limit(tmp_path):
    """A job limited by its CPU time (`Limits.by_cpu`) passes when it waits longer than its CPU budget, as a child
    starved by a loaded machine does; one that waits for ever is stopped by the wall clock, with what it used said."""
    waits = _module(tmp_path, "waits", "import time\ntime.sleep(3)\n")
    assert run_module(waits, [], cwd=tmp_path, log_path=tmp_path / "log", limits=Limits.by_cpu(2)).ok
    hangs = _module(tmp_path, "hangs", "import time\nwhile True: time.sleep(1)\n")
    res = run_module(hangs, [], cwd=tmp_path, log_path=tmp_path / "log2", limits=Limits.by_cpu(2), label="cand-w")
    assert res.reason == "timeout" and res.message.startswith("cand-w: timed out after 6s"), res
    if res.cpu_seconds is not None:
        assert res.message.endswith(f"having used {res.cpu_seconds:.0f} CPU seconds of its 2")


def test_groups_left_by_a_dead_process_are_removed(tmp_path):
    from evotrainer.trainer import sandbox

    parent = sandbox.CGROUP_V1 / "pids"
    if not _groups_count_cpu() or not (parent / "cgroup.procs").is_file():
        pytest.skip("no cgroup v1 pids hierarchy here")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left, kept = parent / f"evotrainer-{int(dead.stdout)}-1", parent / f"evotrainer-{os.getpid()}-1"
    left.mkdir(), kept.mkdir()
    try:
        sandbox._sweep.cache_clear()
        sandbox.ChildGroups(8).remove()
        assert not left.exists() and kept.exists()  # a live process's group is its own to remove
    finally:
        for g in (left, kept):
            g.exists() and g.rmdir()


def test_the_log_shows_each_line_while_the_child_runs(tmp_path):
    """A long child (a 30-minute warm-up) is followed with `tail -f` on its log: a line is there when printed, not
    when 8 KB have piled up or the child ends."""
    go = tmp_path / "go"
    mod = _module(tmp_path, "slow", "import pathlib, time\nprint('step 100', flush=True)\n"
                                    f"while not pathlib.Path({str(go)!r}).exists(): time.sleep(0.05)\n")
    done = []
    thread = threading.Thread(target=lambda: done.append(run_module(
        mod, [], cwd=tmp_path, log_path=tmp_path / "log", limits=Limits(timeout_s=60))))
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while "step 100" not in ((tmp_path / "log").read_text() if (tmp_path / "log").exists() else ""):
            assert time.monotonic() < deadline and not done, "the line reached the log only when the child ended"
            time.sleep(0.05)
    finally:
        go.touch()
        thread.join()
    assert done[0].ok


def test_memory_limit(tmp_path):
    mod = _module(tmp_path, "hog", "x = bytearray(8 * 1024**3)\n")
    res = run_module(mod, [], cwd=tmp_path, log_path=tmp_path / "log", limits=Limits(timeout_s=60, memory_mb=1024))
    assert res.reason == "memory", res


def test_signal_is_a_crash_and_exceptions_keep_their_line(tmp_path):
    mod = _module(tmp_path, "sig", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    res = run_module(mod, [], cwd=tmp_path, log_path=tmp_path / "log1", limits=Limits(timeout_s=60))
    assert res.reason == "crash" and "SIGSEGV" in res.message
    mod = _module(tmp_path, "boom", "raise ValueError('reward returned 3 values for 4 completions')\n")
    res = run_module(mod, [], cwd=tmp_path, log_path=tmp_path / "log2", limits=Limits(timeout_s=60), label="cand-y")
    assert res.reason == "error"
    assert res.message == "cand-y: ValueError: reward returned 3 values for 4 completions"


def test_secrets_are_not_inherited(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("HF_TOKEN", "hf-secret")
    monkeypatch.setenv("HARMLESS", "yes")
    mod = _module(tmp_path, "env", "import os\nprint(sorted(k for k in os.environ if 'KEY' in k or 'TOKEN' in k "
                                   "or k == 'HARMLESS'))\n")
    res = run_module(mod, [], cwd=tmp_path, log_path=tmp_path / "log", limits=Limits(timeout_s=60))
    assert res.ok
    log = (tmp_path / "log").read_text()
    assert "HARMLESS" in log and "OPENAI_API_KEY" not in log and "HF_TOKEN" not in log
    assert sys.executable  # the child ran with the same interpreter


def test_no_network_where_the_os_allows_it(tmp_path):
    import socket

    from evotrainer.trainer.sandbox import network_isolation

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    mod = _module(tmp_path, "net", f"import socket\ns = socket.socket()\ns.settimeout(2)\n"
                                   f"print('connect', s.connect_ex(('127.0.0.1', {port})))\n")
    try:
        res = run_module(mod, [], cwd=tmp_path, log_path=tmp_path / "log", limits=Limits(timeout_s=30))
        allowed = run_module(mod, [], cwd=tmp_path, log_path=tmp_path / "log2",
                             limits=Limits(timeout_s=30, network=True))
    finally:
        server.close()
    assert res.ok and allowed.ok
    assert "connect 0" in (tmp_path / "log2").read_text()  # the same code reaches the server when allowed
    if network_isolation():
        assert "connect 0" not in (tmp_path / "log").read_text()


def test_an_isolated_childs_cpu_time_reaches_the_parent(tmp_path):
    """bubblewrap's PID namespace hides an isolated child's CPU time from RUSAGE_CHILDREN; the child reports it at
    its end (`child_main`) and the parent adds it to `isolated_cpu_seconds`, which a plain child leaves alone (its
    time is in RUSAGE_CHILDREN already)."""
    import resource
    import shutil
    import uuid
    from pathlib import Path

    from evotrainer.trainer.sandbox import Isolation, isolated_cpu_seconds

    root = Path.home() / ".cache" / "evotrainer" / f"test-cpu-{uuid.uuid4().hex[:8]}"  # not /tmp: the child has its own
    root.mkdir(parents=True)
    try:
        mod = _module(root, "busy", "import time\nfrom evotrainer.trainer.sandbox import child_main\n"
                                    "def main(argv):\n    t = time.process_time()\n"
                                    "    while time.process_time() - t < 0.5: pass\n    return 0\nchild_main(main)\n")
        events: list = []
        before, rusage = isolated_cpu_seconds(), resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
        res = run_module(mod, [], cwd=root, log_path=root / "log", limits=Limits(timeout_s=60),
                         on_progress=events.append, isolation=Isolation(read=[str(root)], write=[str(root / "out")]))
        assert res.ok, res.message
        assert 0.45 <= isolated_cpu_seconds() - before < 5 and events == []  # the report is not a progress event
        assert isolated_cpu_seconds() - before == pytest.approx(res.cpu_seconds, abs=0.01)  # the group counts it
        assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - rusage < 0.3  # what was missing
        before = isolated_cpu_seconds()
        assert run_module(mod, [], cwd=root, log_path=root / "log2", limits=Limits(timeout_s=60)).ok
        assert isolated_cpu_seconds() == before
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_lifeline_ends_a_child_whose_parent_is_gone(tmp_path):
    """Every child starts through launch.py, holding the read end of a pipe only its parent can write: a parent that
    is already gone when the child starts (a kill between fork and the death signal being armed) means the child
    never runs its module; a parent that dies later ends it within moments, whatever it was doing."""
    import time

    mod = _module(tmp_path, "sleeper", "import pathlib, time\npathlib.Path('ran').write_text('x')\ntime.sleep(60)\n")

    def start(read_fd: int) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "evotrainer.trainer.launch", str(read_fd), mod], cwd=tmp_path,
                                pass_fds=(read_fd,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    r, w = os.pipe()
    os.close(w)  # the parent died before the child started
    child = start(r)
    os.close(r)
    assert child.wait(timeout=30) == 1 and not (tmp_path / "ran").exists()
    r, w = os.pipe()
    child = start(r)
    os.close(r)
    deadline = time.time() + 30
    while not (tmp_path / "ran").exists() and time.time() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "ran").exists() and child.poll() is None  # running its module, 60 s of sleep ahead
    os.close(w)  # the parent dies
    started = time.time()
    assert child.wait(timeout=10) == 1 and time.time() - started < 2


def test_a_gpu_job_sees_the_nvidia_devices_and_nothing_else(monkeypatch, tmp_path):
    """Only an isolation that asks for the GPU gets the NVIDIA device files bound into its /dev (a training job on
    `--device cuda`) and /sys read-only; every other child's /dev stays bubblewrap's minimal one, without /sys."""
    from evotrainer.trainer import sandbox

    devices = ["/dev/nvidia0", "/dev/nvidia-uvm", "/dev/nvidiactl"]
    monkeypatch.setattr(sandbox.glob, "glob", lambda pattern: devices if pattern == "/dev/nvidia*" else [])

    def binds(cmd: list[str]) -> list[str]:
        return [cmd[i + 1] for i, a in enumerate(cmd) if a == "--dev-bind"]

    gpu = sandbox.bwrap_prefix(sandbox.Isolation(write=[str(tmp_path / "o")], gpu=True), cwd=tmp_path)
    plain = sandbox.bwrap_prefix(sandbox.Isolation(write=[str(tmp_path / "o")]), cwd=tmp_path)
    assert binds(gpu) == sorted(devices) and binds(plain) == []
    assert gpu.index("--dev") < gpu.index("--dev-bind")  # bound into the fresh /dev, not replaced by it
    ro = [cmd[i + 1] for cmd in (gpu,) for i, a in enumerate(cmd) if a == "--ro-bind"]
    assert "/sys" in ro and "/sys" not in plain  # NCCL's topology, for GPU jobs only


def test_no_child_module_is_imported_by_its_own_package():
    """A child runs as `python -m <module>`: if its package's __init__ imports the module, runpy executes it twice
    (once imported, once as __main__) and warns in every child's log (the replay child did). Each child's package is
    imported in a fresh interpreter and must not have loaded the child's module."""
    from evotrainer.trainer.jobs import JOB_KINDS

    probe = ("import importlib, sys\n"
             f"for m in {sorted(JOB_KINDS)!r}:\n"
             "    importlib.import_module(m.rsplit('.', 1)[0])\n"
             "print(sorted(m for m in " f"{sorted(JOB_KINDS)!r}" " if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
