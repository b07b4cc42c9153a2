"""Process-wide settings: the offline switches (DESIGN §10), set by the CLI at start-up and in every child."""

from __future__ import annotations

import os
from pathlib import Path

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "ANONYMIZED_TELEMETRY": "False",  # chromadb
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
}


def apply_offline_switches() -> None:
    """Nothing is downloaded from a model or dataset hub at run time."""
    os.environ.update(OFFLINE_ENV)


def work_dir() -> Path:
    """Scratch space for the specs and logs of jobs that have no run directory (`$EVOTRAINER_WORK`, default
    ~/.cache/evotrainer/work: not under /tmp, which an isolated child sees as its own empty tmpfs)."""
    return Path(os.environ.get("EVOTRAINER_WORK", Path.home() / ".cache" / "evotrainer" / "work"))
