"""The file locks on real files (filelock): the skill store's write lock and the harness repository's lock wait
for a holder in another thread of the same process and in another process; a run's lock refuses a second driver at
once, thread or process, naming the holder's pid; a warm policy being built is waited for, not built twice."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from evotrainer.base.errors import UserError
from evotrainer.memory.skill import Skill, Trigger
from evotrainer.memory.store import SkillStore
from evotrainer.workspaces.repo import HarnessRepo
from evotrainer.workspaces.run import RunWorkspace

ROOT = Path(__file__).parents[1]


def assert_waits(hold: AbstractContextManager, body: Callable[[], object], setup: str, locked: str,
                 marks: Path) -> None:
    """While `hold` is held, `body` in another thread and the statement `locked` in another process (after `setup`,
    with `marks` as sys.argv[1]) both wait; once `hold` is released, both finish."""
    marks.mkdir()
    code = (f"import pathlib, sys\n{setup}\nmarks = pathlib.Path(sys.argv[1])\n(marks / 'trying').touch()\n"
            f"{locked}\n(marks / 'in').touch()\n")
    done = threading.Event()
    thread = threading.Thread(target=lambda: (body(), done.set()))
    with hold:
        proc = subprocess.Popen([sys.executable, "-c", code, str(marks)], cwd=ROOT, stderr=subprocess.PIPE, text=True)
        thread.start()
        deadline = time.monotonic() + 120
        while not (marks / "trying").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # the child imports and opens what it needs before it asks for the lock
        assert (marks / "trying").exists(), proc.communicate()[1]
        time.sleep(1.0)
        assert not done.is_set(), "another thread entered the held lock"
        assert proc.poll() is None and not (marks / "in").exists(), "another process entered the held lock"
        entered = time.monotonic()
    thread.join(60)
    assert done.is_set()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and (marks / "in").exists(), err
    assert time.monotonic() >= entered


def test_skill_store_writes_wait_for_the_holder(tmp_path):
    store = SkillStore(tmp_path / "store", embedding="hashing")
    skill = Skill(id="sk-thread", trigger=Trigger(text="dead groups"), factor="filters.group_filters",
                  intervention="drop dead groups")
    setup = ("from evotrainer.memory.skill import Skill, Trigger\nfrom evotrainer.memory.store import SkillStore\n"
             f"store = SkillStore({str(store.path)!r}, embedding='hashing')\n"
             "skill = Skill(id='sk-process', trigger=Trigger(text='truncation'), factor='recipe.max_completion_length',"
             " intervention='raise the limit')")
    assert_waits(store._writing(), lambda: store.put(skill), setup, "store.put(skill)", tmp_path / "marks")
    assert sorted(s.id for s in SkillStore(store.path).list()) == ["sk-process", "sk-thread"]
    assert (store.path / ".lock").is_file()  # the lock file stays where it was: in the store


def test_harness_repository_lock_waits_for_the_holder(tmp_path):
    repo = HarnessRepo.init_from_template(tmp_path / "h", "math")
    other = HarnessRepo(repo.path)  # another object on the same repository: its own lock, the same file
    setup = f"from evotrainer.workspaces.repo import HarnessRepo\nrepo = HarnessRepo({str(repo.path)!r})"

    def enter() -> None:
        with other._locked():
            pass

    assert_waits(repo._locked(), enter, setup, "with repo._locked(): pass", tmp_path / "marks")
    assert oct((repo.path / ".git" / "evotrainer.lock").stat().st_mode & 0o777) == "0o600"


def test_run_lock_refuses_a_second_driver_at_once(tmp_path):
    ws = RunWorkspace.create(tmp_path / "run", "math")
    errors: list[BaseException] = []

    def second() -> None:
        try:
            with RunWorkspace(ws.path).lock():
                pass
        except UserError as e:
            errors.append(e)

    with ws.lock():
        assert (ws.path / ".lock").read_text() == str(os.getpid())
        t0 = time.monotonic()
        thread = threading.Thread(target=second)
        thread.start()
        thread.join(10)
        assert time.monotonic() - t0 < 5  # refused, not waited for
        code = ("import sys; from evotrainer.workspaces.run import RunWorkspace\n"
                "with RunWorkspace(sys.argv[1]).lock(): pass")
        proc = subprocess.run([sys.executable, "-c", code, str(ws.path)], capture_output=True, text=True, cwd=ROOT)
    assert len(errors) == 1 and f"already being driven by process {os.getpid()}" in str(errors[0])
    assert proc.returncode != 0 and f"already being driven by process {os.getpid()}" in proc.stderr
    assert (ws.path / ".lock").read_text() == ""  # released: no stale pid
    with pytest.raises(RuntimeError, match="boom"):
        with ws.lock():
            raise RuntimeError("boom")
    with RunWorkspace(ws.path).lock():  # released after an error too
        pass


def test_a_warm_policy_another_process_is_building_is_waited_for_not_built_again(tmp_path, monkeypatch):
    """Two processes missing the same warm policy at once (`compare --jobs 2`): the second waits on the cache's lock
    for the key, then reads what the first built, and starts no warm-up of its own; a killed warm-up's half-written
    copy is cleared once the lock is held."""
    from filelock import FileLock

    from evotrainer.trainer import jobs
    from evotrainer.trainer.policy import ModelConfig, WarmupConfig, cache_key, cache_root
    from tests.conftest import TINY_MODEL, TINY_WARMUP

    monkeypatch.setenv("EVOTRAINER_CACHE", str(tmp_path / "cache"))
    model, warm = ModelConfig(**TINY_MODEL), WarmupConfig(**TINY_WARMUP)
    key = cache_key("math", 3, model, warm)
    stale = cache_root() / f"{key}.tmp99999"
    stale.mkdir(parents=True)
    got: list[Path] = []
    waiter = threading.Thread(target=lambda: got.append(jobs.warm_policy("math", 3, tmp_path / "work", model_cfg=model,
                                                                        warm_cfg=warm)))
    with FileLock(str(cache_root() / f"{key}.lock")):  # the first process, building
        waiter.start()
        time.sleep(1.0)
        assert not got and stale.exists()  # waiting, not building
        (cache_root() / key).mkdir()
        (cache_root() / key / "meta.json").write_text("{}")  # what the first process's warm-up wrote
    waiter.join(60)
    assert got == [cache_root() / key] and not stale.exists()
    assert not (tmp_path / "work").exists()  # no spec, no log: no warm-up child of its own
