"""Run workspaces, the harness git repository and the starting harness templates."""

from pathlib import Path

TEMPLATES = Path(__file__).parent / "templates"
