"""The package's dependencies run one way (docs/architecture.md, "Dependencies"): every import of an EvoTrainer
module, at the top of a file or inside a function, points to its own part or to a part below it."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# each part, from the bottom up, with the parts it may import (besides itself)
ALLOWED = {
    "base": set(),
    "trainer": {"base"},
    "workspaces": {"base", "trainer"},
    "memory": {"base", "trainer"},
    "agents": {"base", "trainer", "workspaces", "memory"},
    "graph": {"base", "trainer", "workspaces", "memory", "agents"},
    "app": {"base", "trainer", "workspaces", "memory", "agents", "graph"},
}
DIRS = {"base": "base", "trainer": "trainer", "workspaces": "workspaces", "memory": "memory", "agents": "agents",
        "graph": "graph", "app": "evotrainer"}
HARNESS_CODE = ROOT / "workspaces" / "templates"  # harness code, not the package's: it runs in isolated children


def part_of(module: str) -> str | None:
    """`evotrainer.trainer.backtest.arms` -> trainer; `evotrainer.cli` -> app; `evotrainer` itself -> None."""
    names = module.split(".")
    if names[0] != "evotrainer" or len(names) == 1:
        return None
    return names[1] if names[1] in ALLOWED and names[1] != "app" else "app"


def imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from evotrainer import x` names a module of the top package: count it as evotrainer.x
            names = [f"{node.module}.{a.name}" for a in node.names] if node.module == "evotrainer" else [node.module]
            out += [(node.lineno, n) for n in names]
    return out


def violations() -> list[str]:
    bad = []
    for part, d in DIRS.items():
        for path in sorted((ROOT / d).rglob("*.py")):
            if HARNESS_CODE in path.parents:
                continue
            for line, module in imports(path):
                target = part_of(module)
                if target is not None and target != part and target not in ALLOWED[part]:
                    bad.append(f"{path.relative_to(ROOT)}:{line} ({part}) imports {module} ({target})")
    return bad


def test_no_import_points_up():
    assert violations() == []


def test_the_walk_sees_an_import_against_the_direction(tmp_path, monkeypatch):
    """The check itself: a function-level import from a higher part is caught (a test that cannot fail is none)."""
    fake = tmp_path / "trainer"
    fake.mkdir()
    (fake / "x.py").write_text("def f():\n    from evotrainer.workspaces.run import RunWorkspace\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "HARNESS_CODE", tmp_path / "none")
    for d in DIRS.values():
        (tmp_path / d).mkdir(exist_ok=True)
    assert violations() == ["trainer/x.py:2 (trainer) imports evotrainer.workspaces.run (workspaces)"]
    assert part_of("evotrainer.cli") == "app" and part_of("evotrainer.base.errors") == "base"
