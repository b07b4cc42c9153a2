"""Process-wide settings: the offline switches (DESIGN §10), set by the CLI at start-up and in every child."""

from __future__ import annotations

import os

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
