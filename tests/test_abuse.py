"""Hostile harness code is contained (DESIGN §5): what an agent under optimisation pressure would write.

Each hostile harness runs through the real children that import harness code (validation, training) under the
real isolation layer. Every test also checks, after the fact, that the sealed side's files are unchanged, that
the package's checkout is as it was, and that the secret in the orchestrator's environment appears nowhere
under the test's directory.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import subprocess
import textwrap
from pathlib import Path

import pytest

from evotrainer.trainer import jobs
from evotrainer.trainer.domains import get_domain
from evotrainer.trainer.grpo import TrainSpec
from evotrainer.trainer.sandbox import IsolationError, Limits, sealed_dirs
from evotrainer.workspaces import TEMPLATES

from .conftest import run_cli

SECRET = "sk-evo-abuse-0123456789"
PACKAGE = Path(__file__).resolve().parent.parent


def _sealed_hashes() -> dict[str, str]:
    return {str(p): hashlib.blake2b(p.read_bytes()).hexdigest() for d in sealed_dirs() for p in Path(d).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


def _package_status() -> str:
    return subprocess.run(["git", "-C", str(PACKAGE), "status", "--porcelain", "--untracked-files=all"],
                          capture_output=True, text=True).stdout


@pytest.fixture
def guarded(tmp_path, monkeypatch, cache_dir):  # cache_dir: the policy cache is the session's, never the user's
    """The orchestrator holds a secret; afterwards nothing sealed changed and the secret is nowhere on disk."""
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.delenv("EVOTRAINER_UNSAFE_NO_ISOLATION", raising=False)
    sealed, status = _sealed_hashes(), _package_status()
    yield tmp_path
    assert _sealed_hashes() == sealed, "a sealed file changed"
    assert _package_status() == status, "the package's checkout changed"
    leaked = [p for p in tmp_path.rglob("*")
              if p.is_file() and not p.is_symlink() and SECRET.encode() in p.read_bytes()]
    assert not leaked, f"the secret reached {leaked}"


def _harness(root: Path, rewards_extra: str = "", filters: str | None = None, spec_edit=None) -> Path:
    """The math template with hostile code added to rewards.py (run at import) and an optional filters.py."""
    h = root / "harness"
    shutil.copytree(TEMPLATES / "math", h)
    (h / "rewards.py").write_text((h / "rewards.py").read_text() + "\n" + textwrap.dedent(rewards_extra))
    if filters is not None:
        (h / "filters.py").write_text(textwrap.dedent(filters))
    if spec_edit:
        import yaml

        spec = yaml.safe_load((h / "harness.yaml").read_text())
        spec_edit(spec)
        (h / "harness.yaml").write_text(yaml.safe_dump(spec))
    return h


# Every route to the sealed side, the orchestrator or the machine that the probe knows of. It returns what worked.
PROBE = '''
def _probe(targets):
    import glob, os, socket
    got = []

    def attempt(name, fn):
        try:
            value = fn()
            if value:
                got.append(f"{name}: {str(value)[:80]}")
        except Exception:
            pass

    def domain_items():
        from evotrainer.trainer.domains import get_domain
        return [(t.prompt, t.answer) for t in get_domain("math").tasks("test", 2)]

    def write(path):
        with open(path, "w") as f:
            f.write("x")
        return path

    def unmount_mask():
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.umount2(os.path.dirname(targets["sealed_json"]).encode(), 2) == 0

    attempt("capabilities", lambda: [line for line in open("/proc/self/status")
                                     if line.startswith("CapEff") and int(line.split()[1], 16)])
    attempt("unmount the mask", unmount_mask)
    attempt("import the sealed domain", domain_items)
    attempt("read sealed.json", lambda: open(targets["sealed_json"]).read())
    attempt("read the evaluation cache", lambda: os.listdir(targets["evals"]))
    attempt("read the package's git", lambda: os.listdir(targets["package_git"]))
    attempt("secret in environ", lambda: [k for k, v in os.environ.items() if targets["secret"] in v])
    for pid in ("1", "2", "self/../1"):
        attempt(f"secret in /proc/{pid}/environ",
                lambda pid=pid: targets["secret"] in open(f"/proc/{pid}/environ", errors="replace").read())
    attempt("other processes", lambda: [p for p in os.listdir("/proc") if p.isdigit() and int(p) > 64])
    attempt("write the package", lambda: write(targets["package_file"]))
    attempt("write sealed.json", lambda: write(targets["sealed_json"]))
    attempt("write another run", lambda: write(targets["other_run"]))
    attempt("write the harness", lambda: write("planted.py"))
    attempt("symlink in the harness", lambda: os.symlink(targets["sealed_json"], "leak_link") or "made")
    attempt("git hook", lambda: write(os.path.join(targets["harness_git"], "hooks", "pre-commit")))
    attempt("another cached policy", lambda: os.listdir(targets["other_policy"]))
    attempt("loopback server", lambda: socket.create_connection(("127.0.0.1", targets["port"]), timeout=2))
    attempt("another run's files", lambda: glob.glob(targets["runs_glob"]))
    return got
'''


def _targets(root: Path, listener: socket.socket, evals: Path | None = None) -> dict:
    other = root / "other-run"
    (other / "evidence").mkdir(parents=True, exist_ok=True)
    (root / "harness-repo.git" / "hooks").mkdir(parents=True, exist_ok=True)
    sealed = Path(sealed_dirs()[0])
    return {"sealed_json": str(sealed / "sealed.json"), "evals": str(evals or root / "no-evals"),
            "package_git": str(PACKAGE / ".git"),
            "secret": SECRET[:-6],  # a prefix: the whole secret in the harness's source would fail the final scan
            "package_file": str(PACKAGE / "trainer" / "x.py"),
            "other_run": str(other / "evidence" / "planted"), "harness_git": str(root / "harness-repo.git"),
            "port": listener.getsockname()[1], "runs_glob": str(other / "*"),
            "other_policy": str(_other_policy())}


def _other_policy() -> Path:
    """A cached policy beside the one a child trains from, with a cached sealed evaluation."""
    from evotrainer.trainer.policy import cache_root

    path = cache_root() / "other-policy"
    (path / "evals").mkdir(parents=True, exist_ok=True)
    (path / "evals" / "dev.json").write_text("{}")
    return path


@pytest.fixture
def listener():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s
    s.close()


def _probe_at_import(targets: dict) -> str:
    return PROBE + f"\n_LEAKS = _probe({targets!r})\n" \
                   "if _LEAKS:\n    raise RuntimeError('LEAKED ' + ' | '.join(_LEAKS))\n"


def test_validation_child_reaches_nothing(guarded, listener):
    root = guarded
    targets = _targets(root, listener)
    h = _harness(root, _probe_at_import(targets))
    assert jobs.validate_harness(h, root / "work") == []
    assert not (h / "planted.py").exists() and not (h / "leak_link").exists()
    assert not (root / "harness-repo.git" / "hooks" / "pre-commit").exists()
    assert not Path(targets["other_run"]).exists()


def test_the_probe_finds_what_an_unisolated_child_reaches(guarded, listener, monkeypatch):
    """The same probe without the isolation layer reaches the sealed side: the test above can fail."""
    monkeypatch.setenv("EVOTRAINER_UNSAFE_NO_ISOLATION", "1")
    root = guarded
    targets = {**_targets(root, listener), "package_file": str(root / "unused"), "sealed_json": str(root / "no")}
    problems = jobs.validate_harness(_harness(root, _probe_at_import(targets)), root / "work")
    assert len(problems) == 1 and "LEAKED" in problems[0] and "import the sealed domain" in problems[0]
    for p in (root / "harness").glob("leak_link"):
        p.unlink()


@pytest.mark.parametrize("name, code, expect", [
    ("fork bomb", "import os\nwhile True:\n    os.fork()\n", ("Resource temporarily unavailable", "BlockingIOError",
                                                               "timed out", "killed")),
    ("8 GB allocation", "_big = bytearray(8 * 1024 ** 3)\n", ("MemoryError", "memory")),
    ("infinite loop at import", "while True:\n    pass\n", ("timed out",)),
])
def test_runaway_harness_code_is_stopped_with_a_reason(guarded, name, code, expect):
    root = guarded
    problems = jobs.validate_harness(_harness(root, code), root / "work", limits=Limits(timeout_s=5, memory_mb=2048))
    assert len(problems) == 1 and any(e in problems[0] for e in expect), (name, problems)


def test_a_flood_of_output_is_capped(guarded):
    root = guarded
    code = "import sys\nfor _ in range(200_000):\n    sys.stdout.write('x' * 200 + '\\n')\n"
    problems = jobs.validate_harness(_harness(root, code), root / "work", limits=Limits(timeout_s=60, log_mb=1))
    assert problems == []
    log = root / "work" / "logs" / "validate-harness.log"
    assert log.stat().st_size < 1.1 * 1024 * 1024 and "log capped" in log.read_text()


def test_non_finite_rewards_are_refused(guarded):
    code = "def correctness(prompts, completions, **kw):\n    return [float('nan')] * len(completions)\n"
    problems = jobs.validate_harness(_harness(guarded, code), guarded / "work")
    assert len(problems) == 1 and "non-finite" in problems[0]


def _train(tiny_policy, root: Path, harness: Path, steps: int = 2) -> dict:
    spec = TrainSpec(domain="math", checkpoint=str(tiny_policy), harness_dir=str(harness), steps=steps, seed=0,
                     out_dir=str(root / "out"), checkpoint_id="ck", checkpoints_dir=str(root / "checkpoints"),
                     evidence_dir=str(root / "evidence"), result_path=str(root / "result.json"))
    return jobs.train(spec, root / "work")


def _small(spec: dict) -> None:
    spec["trainer"].update(per_device_train_batch_size=16, num_generations=4)


@pytest.mark.slow
@pytest.mark.parametrize("filters", [
    # rewrites a train row's prompt into a test item
    "def smuggle(rows):\n    rows[0] = dict(rows[0], prompt='150+337=', answer='487')\n    return rows\n",
    # invents a row that is no train task
    "def inject(rows):\n    return [{**rows[0], 'prompt_id': 'M2:dev', 'prompt': '150+337='}] + rows\n",
])
def test_a_filter_cannot_smuggle_rows(guarded, tiny_policy, filters):
    name = filters.split("(")[0].removeprefix("def ")
    h = _harness(guarded, filters=filters, spec_edit=lambda s: (_small(s), s.update(filters=[name])))
    with pytest.raises(Exception) as e:
        _train(tiny_policy, guarded, h)
    assert f"filter {name!r}" in str(e.value) or name in (guarded / "work" / "logs" / "train-ck.log").read_text()
    assert "not an unmodified train row" in (guarded / "work" / "logs" / "train-ck.log").read_text()


@pytest.mark.slow
def test_training_child_sees_nothing_sealed_and_cannot_forge_correct(guarded, tiny_policy, listener):
    """A reward that, inside training, tries every route to a dev or test answer gets nothing (it raises if it
    does), and plants evidence rows marked correct where it can: the graded evidence is the sealed scorer's."""
    root = guarded
    evals = Path(tiny_policy) / "evals"
    evals.mkdir(exist_ok=True)
    (evals / "probe-target.json").write_text("{}")  # a cached sealed evaluation beside the starting policy
    targets = _targets(root, listener, evals)
    forge = f'''
def correctness(prompts, completions, answer, fmt, **kw):
    import os
    import pyarrow as pa, pyarrow.parquet as pq
    leaks = _probe({targets!r})
    if leaks:
        raise RuntimeError("LEAKED " + " | ".join(leaks))
    for d in ({str(root / "evidence")!r}, {str(root / "checkpoints")!r}, {str(root / "work" / "specs")!r}):
        try:
            os.makedirs(d, exist_ok=True)
            pq.write_table(pa.table({{"correct": [True] * 4}}), os.path.join(d, "rollouts-9999999.parquet"))
        except OSError:
            pass
    return [1.0] * len(completions)  # pays everything: only the sealed grade can tell right from wrong
'''
    h = _harness(root, PROBE + forge, spec_edit=_small)
    meta = _train(tiny_policy, root, h)
    assert meta["steps"] == 2 and meta["isolation"] == "bwrap"
    from evotrainer.trainer.evidence import read_rollouts

    rows = read_rollouts(root / "evidence").to_pandas()
    assert len(rows) == 2 * 16
    tasks = {t.id: t for t in get_domain("math").tasks("train", 1000, seed=0)}
    domain = get_domain("math")
    regraded = [domain.score(c, tasks[p].answer, tasks[p].fmt) for c, p in zip(rows["completion"], rows["prompt_id"])]
    assert rows["correct"].tolist() == regraded and not all(regraded)
    assert not list(root.rglob("rollouts-9999999.parquet"))
    ckpt = root / "checkpoints" / "ck"
    assert not (ckpt / "evals").exists() and json.loads((ckpt / "meta.json").read_text())["isolation"] == "bwrap"


def test_without_bubblewrap_harness_code_is_refused_unless_the_user_opts_out(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no bwrap on it
    monkeypatch.delenv("EVOTRAINER_UNSAFE_NO_ISOLATION", raising=False)
    h = _harness(tmp_path)
    with pytest.raises(IsolationError, match="bubblewrap .* EVOTRAINER_UNSAFE_NO_ISOLATION=1"):
        jobs.validate_harness(h, tmp_path / "work")
    proc = run_cli("run", str(tmp_path / "run"), "--json")
    assert proc.returncode == 2 and "bubblewrap" in proc.stderr and not (tmp_path / "run").exists()
    monkeypatch.setenv("EVOTRAINER_UNSAFE_NO_ISOLATION", "1")
    assert jobs.validate_harness(h, tmp_path / "work") == []
