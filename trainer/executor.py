"""Where the heavy jobs the loop and `compare` fan out run: every child process of `jobs.run_child` (the main
line's training segments, sealed evaluations, replays, diagnoses, compare's static arms and hpo trials) and each
short-run arm as a whole (train a few GRPO steps, score on sealed dev: `backtest.arms.train_arm`).

- `local` (the default): in this process's thread, which starts the job's isolated children as always; the loop's
  own thread pool (`loop.backtest.parallel`) and `compare --jobs` bound how many run at once.
- `ray` (`--executor ray [--ray-address ADDR]`, the `ray` extra): each job a Ray task asking for one CPU (and a GPU
  when its child trains on one), run by a Ray worker that starts the same isolated children (bubblewrap holds there
  as here), its typed result returned to the caller. A job's own jobs run where it runs (a Ray worker's executor is
  local), so no task ever waits on another while holding a CPU. `compare --jobs N --executor ray` runs N cell
  orchestrators on this machine (they hold no CPU of the cluster) whose jobs spread over the cluster. Without an
  address a local Ray instance is started with this machine's cores; with one (`ray start --head` elsewhere), the
  run directory and the cache must be on a filesystem every node sees, since jobs write where the run expects them.

Scheduling stays in the loop (which arms, in what order, when to add a seed, one thread per arm in flight), so the
verdicts do not depend on the executor; a finished arm (its checkpoint's meta.json) is never redone, whichever ran
it. A Ray task is never retried by Ray (a failed arm fails the backtest as it does locally). When the orchestrator
dies, its tasks die with it: Ray ends a dead driver's tasks, and each task's children hold a lifeline to their
worker.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable
from typing import Protocol, TypeVar

from evotrainer.base.errors import UserError
from evotrainer.base.settings import OFFLINE_ENV

T = TypeVar("T")
KINDS = ("local", "ray")
# what a Ray worker must see of this process's environment: the offline switches and EvoTrainer's own settings
FORWARDED = ("EVOTRAINER_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


class Executor(Protocol):
    name: str
    jobs: Counter  # the jobs this process ran through it, by kind

    def call(self, job: str, fn: Callable[..., T], *args, cpus: int = 1, gpus: int = 0, **kwargs) -> T:
        """`fn(*args, **kwargs)` where this executor runs jobs, counted under `job` (its kind); blocks until it
        returns (callers run several from threads)."""
        ...


class _Counted:
    def __init__(self):
        self.jobs: Counter = Counter()
        self._lock = threading.Lock()

    def _count(self, job: str) -> None:
        with self._lock:
            self.jobs[job] += 1


class LocalExecutor(_Counted):
    name = "local"

    def call(self, job: str, fn: Callable[..., T], *args, cpus: int = 1, gpus: int = 0, **kwargs) -> T:
        self._count(job)
        return fn(*args, **kwargs)


class RayExecutor(_Counted):
    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None):
        super().__init__()
        try:
            import ray
        except ImportError as e:
            raise UserError("--executor ray needs Ray: pip install 'ray>=2.40' (or pip install -e '.[ray]')") from e
        env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED)} | OFFLINE_ENV
        try:
            ray.init(address=address, num_cpus=None if address else (num_cpus or os.cpu_count()),
                     include_dashboard=False, log_to_driver=False, configure_logging=False,
                     ignore_reinit_error=True, runtime_env={"env_vars": env})
        except Exception as e:  # an address nobody answers at, a version mismatch
            raise UserError(f"--executor ray: cannot reach Ray{f' at {address}' if address else ''} "
                            f"({type(e).__name__}: {' '.join(str(e).split())[:200]}): check --ray-address, or use "
                            "--executor local") from e
        self.ray = ray
        self.requested = address
        self.address = ray.get_runtime_context().gcs_address  # where other processes join this instance
        self._remote: dict[tuple, object] = {}

    def call(self, job: str, fn: Callable[..., T], *args, cpus: int = 1, gpus: int = 0, **kwargs) -> T:
        key = (fn, cpus, gpus)
        if key not in self._remote:
            self._remote[key] = self.ray.remote(num_cpus=cpus, num_gpus=gpus, max_retries=0)(fn)
        self._count(job)
        try:
            return self.ray.get(self._remote[key].remote(*args, **kwargs))
        except self.ray.exceptions.RayTaskError as e:  # the job's own exception, as a local call would raise it
            if isinstance(getattr(e, "cause", None), Exception):
                raise e.cause from None
            raise


_current: Executor = LocalExecutor()


def configure(kind: str = "local", address: str | None = None) -> Executor:
    """Set this process's executor (the command line does, from --executor and --ray-address)."""
    global _current
    if kind not in KINDS:
        raise UserError(f"--executor {kind!r}: choose {' or '.join(KINDS)}")
    if address and kind != "ray":
        raise UserError("--ray-address is for --executor ray")
    if kind == _current.name and getattr(_current, "requested", None) == address:
        return _current
    _current = RayExecutor(address) if kind == "ray" else LocalExecutor()
    return _current


def current() -> Executor:
    return _current
