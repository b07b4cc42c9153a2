"""Policy factory: a tiny Llama-architecture model with a character-level tokenizer, warmed up by SFT.

On a CPU there is no model hub (DESIGN §9-10): the default policy is built from a config, then
warmed up with TRL's SFTTrainer on the domain's train split until a target dev accuracy or a
step cap, and cached on disk under a key of (domain, seed, model config, SFT config). A warm-up
never runs twice for the same key; a half-written cache entry is never read (atomic rename).

`--model PATH` replaces all this with any local Hugging Face causal LM.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from evotrainer.base.errors import UserError

# Every character the domains write, plus three specials. Order is part of the cache key.
CHARSET = "0123456789+-*/=()<>[]{}_#%!?:;.,'\"` \n\tabcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ$@&|^~\\"
SPECIALS = ("<pad>", "<eos>", "<unk>")


@dataclass(frozen=True)
class ModelConfig:
    """The tiny policy: ~1M parameters at the defaults (DESIGN §10)."""

    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 512
    max_positions: int = 256


@dataclass(frozen=True)
class WarmupConfig:
    """SFT warm-up: stop at `target_accuracy` on a dev slice or at `max_steps`, whichever comes first."""

    # The 1M policy learns the mixture slowly, then fast: greedy accuracy on a 400-item dev slice was
    # 0.15 at step 2000, 0.37 at 3000, 0.59 at 4000. Stopping near 0.35 (~8 min on 2 cores) leaves
    # GRPO a learnable middle band and a less peaked policy to explore with (DESIGN §12).
    target_accuracy: float = 0.35
    max_steps: int = 6000
    batch_size: int = 64
    learning_rate: float = 1e-3
    eval_every: int = 250
    eval_items: int = 400
    target_noise: float = 0.0  # share of SFT targets corrupted (cut short, or a stray character): see _noisy


def _noisy(target: str, rng) -> str:
    """A corrupted SFT target: cut short, or with a stray character inserted. A warm policy trained on a few of
    these writes malformed answers about as often as small real models do, instead of almost never."""
    if len(target) > 1 and rng.random() < 0.5:
        return target[:rng.randint(1, len(target) - 1)]
    i = rng.randint(0, len(target))
    return target[:i] + rng.choice("()+-*,x") + target[i:]


# Domains whose default policy differs from the 1M default. Code: expression synthesis needed ~1.6M parameters
# to reach ~0.4 hidden pass after SFT (DESIGN §12). Trained on clean targets only, that policy wrote malformed
# programs 1% of the time, far less than small real code models; 6% corrupted targets make it err like one.
# It is checked every 100 steps so that it stops near the target: checked every 250 it overshot to 0.53, and 60
# GRPO steps then gained only +0.03 greedy (a policy stopped at 0.43 gained +0.11).
DOMAIN_POLICY: dict[str, tuple[ModelConfig, WarmupConfig]] = {
    "code": (ModelConfig(hidden_size=160, intermediate_size=640),
             WarmupConfig(target_accuracy=0.40, max_steps=6000, batch_size=64, eval_every=100, eval_items=400,
                          target_noise=0.06)),
    # SWE: whole episodes of up to 512 tokens. SFT on scripted solutions (half with detours) is learnt in a jump:
    # sealed dev 0.35 at step 250, 0.81 at step 300 (1M policy, batch 32, ~0.75 s a step on 2 cores); checked
    # every 25 steps it stops nearer the learnable middle band.
    "swe": (ModelConfig(max_positions=512),
            WarmupConfig(target_accuracy=0.45, max_steps=2000, batch_size=32, eval_every=25, eval_items=64,
                         target_noise=0.50)),
}


def default_configs(domain: str) -> tuple[ModelConfig, WarmupConfig]:
    """The policy size and SFT warm-up a domain starts from unless told otherwise."""
    return DOMAIN_POLICY.get(domain, (ModelConfig(), WarmupConfig()))


def build_tokenizer():
    """A character-level fast tokenizer: one token per character, `<eos>` ends a completion."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(list(SPECIALS) + list(CHARSET))}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tk.decoder = decoders.Fuse()
    tk.add_special_tokens(list(SPECIALS))
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def build_model(cfg: ModelConfig, tokenizer, seed: int):
    """A freshly initialised Llama causal LM sized by `cfg`."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_heads,
        max_position_embeddings=cfg.max_positions, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id
    )
    return model


def load_policy(path: str | Path):
    """(model, tokenizer) from a checkpoint directory; a clear error when it is not one."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").is_file():
        raise UserError(f"checkpoint {path} not found or not a model directory (no config.json): "
                        "pass a directory written by `evotrainer train` or a local Hugging Face model")
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path)
    model.eval()
    return model, tokenizer


def format_prompts(tokenizer, prompts: list[str]) -> list[str]:
    """Each prompt as one user message in the tokenizer's chat template, where it has one (a pretrained instruct
    model, trainer/pretrained.py); the raw prompt otherwise (the tiny default policies, trained on raw prompts)."""
    if not getattr(tokenizer, "chat_template", None):
        return list(prompts)
    return [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
            for p in prompts]


def generate(model, tokenizer, prompts: list[str], max_new_tokens: int, *, temperature: float = 0.0,
             seed: int = 0, batch_size: int = 256) -> list[str]:
    """Completions for `prompts`, greedy when temperature is 0. Fixed batching makes greedy reproducible."""
    import torch

    out: list[str] = []
    torch.manual_seed(seed)
    with torch.inference_mode():
        for i in range(0, len(prompts), batch_size):
            enc = tokenizer(prompts[i:i + batch_size], return_tensors="pt", padding=True, padding_side="left",
                            add_special_tokens=False)
            kwargs = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else \
                dict(do_sample=False)
            ids = model.generate(**enc, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=tokenizer.eos_token_id, **kwargs)
            out.extend(tokenizer.batch_decode(ids[:, enc["input_ids"].shape[1]:], skip_special_tokens=True))
    return out


def cache_root() -> Path:
    """Where warm policies are cached: $EVOTRAINER_CACHE or ~/.cache/evotrainer."""
    return Path(os.environ.get("EVOTRAINER_CACHE") or Path.home() / ".cache" / "evotrainer") / "policies"


def cache_key(domain: str, seed: int, model_cfg: ModelConfig, warm_cfg: WarmupConfig) -> str:
    """Names a warm policy by everything that shapes it, the domain's tasks included."""
    from evotrainer.trainer.domains import get_domain
    from evotrainer.trainer.domains.base import data_fingerprint

    warmup = asdict(warm_cfg)
    if not warmup["target_noise"]:  # absent from keys made before the knob existed: their policies stay valid
        warmup.pop("target_noise")
    key = {"domain": domain, "seed": seed, "model": asdict(model_cfg), "warmup": warmup, "charset": CHARSET,
           "data": data_fingerprint(get_domain(domain))}
    if getattr(get_domain(domain), "multi_turn", False):  # the scripted SFT episodes are code, not data
        import inspect

        from evotrainer.trainer import swe_scripts

        key["sft"] = hashlib.blake2b("".join(inspect.getsource(f) for f in (
            swe_scripts.solution_script, swe_scripts.sft_rows)).encode() + repr(swe_scripts.DETOURS).encode(),
            digest_size=6).hexdigest()
    blob = json.dumps(key, sort_keys=True)
    return f"{domain}-s{seed}-{hashlib.blake2b(blob.encode(), digest_size=6).hexdigest()}"


SHIPPED = Path(__file__).parent / "policies"  # warm policies shipped with the package, named by their cache key


def cached_policy(domain: str, seed: int, model_cfg: ModelConfig, warm_cfg: WarmupConfig) -> Path | None:
    """The cached warm checkpoint for this key, or None when it has not been built. A policy the package ships under
    the same key (`trainer/policies/`: the warm-up's output for the default configuration, which a change of
    configuration, task data or tokenizer makes a new key) is copied into the cache on first use, so that nobody
    waits for a warm-up that was already done; `EVOTRAINER_NO_SHIPPED=1` builds it instead
    (`benchmarks/shipped_policy.py` compares the two)."""
    key = cache_key(domain, seed, model_cfg, warm_cfg)
    path = cache_root() / key
    if (path / "meta.json").is_file():
        return path
    shipped = SHIPPED / key
    if not (shipped / "meta.json").is_file() or os.environ.get("EVOTRAINER_NO_SHIPPED"):
        return None
    tmp = path.with_name(f"{key}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(shipped, tmp)
    try:
        os.replace(tmp, path)
    except OSError:  # another process put it there first
        shutil.rmtree(tmp, ignore_errors=True)
    return path if (path / "meta.json").is_file() else None


def weights_digest(checkpoint: Path) -> str:
    """A checkpoint's weights, named: sha256 over its weight files (16 hex digits). The warm-up is deterministic on one
    machine but not across CPUs, so a policy's cache key (its configuration) does not name its weights; results meant
    to be paired with each other (a comparison's cells) record this instead."""
    files = sorted(p for p in Path(checkpoint).iterdir() if p.suffix in (".safetensors", ".bin"))
    if not files:
        raise UserError(f"{checkpoint} holds no weights (no .safetensors or .bin file): point at a model directory")
    h = hashlib.sha256()
    for f in files:
        with f.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def _length_bucketed(tasks: list, batch_size: int, seed: int, noise: float = 0.0, size=None) -> list[dict]:
    """SFT rows ordered so that each batch holds examples of similar length, batches in random order.

    A word problem is ~4x longer than a sum; padding every sum to it made SFT 3x slower. (TRL's
    `group_by_length` sampler sorts so strictly that batches became degenerate and SFT stalled.)
    """
    rng = random.Random(seed)
    buckets: dict[int, list] = {}
    for t in tasks:
        buckets.setdefault((size(t) if size else len(t.prompt) + len(t.target)) // 24, []).append(t)
    batches = []
    for items in buckets.values():
        batches.extend(items[i:i + batch_size] for i in range(0, len(items) - batch_size + 1, batch_size))
    rng.shuffle(batches)
    if size:  # already rows (pre-tokenised multi-turn episodes)
        return [r for batch in batches for r in batch]
    noise_rng = random.Random(f"noise-{seed}")
    return [{"prompt": t.prompt, "completion": _noisy(t.target, noise_rng) if noise_rng.random() < noise else t.target}
            for batch in batches for t in batch]


def warm_up(domain_name: str, seed: int, model_cfg: ModelConfig, warm_cfg: WarmupConfig,
            progress=None) -> Path:
    """Build and SFT the tiny policy, write it into the cache atomically, return its path.

    Runs in a child process (the CLI calls it through `evotrainer.trainer.sandbox`); `progress`
    is an optional callable(step, max_steps, accuracy) for the parent's progress bar.
    """
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from evotrainer.trainer.domains import get_domain, grade_all

    # the warm-up runs alone: all cores (1.7x faster than one thread on 2 cores, measured)
    torch.set_num_threads(int(os.environ.get("EVOTRAINER_WARMUP_THREADS", os.cpu_count() or 1)))
    domain = get_domain(domain_name)
    dest = cache_root() / cache_key(domain_name, seed, model_cfg, warm_cfg)
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = build_tokenizer()
    model = build_model(model_cfg, tokenizer, seed)
    multi_turn = getattr(domain, "multi_turn", False)
    train = domain.tasks("train", min(warm_cfg.max_steps, 1000 if not multi_turn else 500) * warm_cfg.batch_size,
                         seed=10_000 + seed)
    if multi_turn:  # scripted solution episodes, observations masked out of the loss
        from evotrainer.trainer.episodes import play
        from evotrainer.trainer.swe_scripts import sft_rows

        rows = sft_rows(tokenizer, train, domain.sft_env, seed, warm_cfg.target_noise)
        data = Dataset.from_list(_length_bucketed(rows, warm_cfg.batch_size, seed, size=lambda r: len(r["input_ids"])))
    else:
        data = Dataset.from_list(_length_bucketed(train, warm_cfg.batch_size, seed, warm_cfg.target_noise))
    dev = domain.tasks("dev", warm_cfg.eval_items)
    max_new = max(len(t.target) for t in dev) + 8
    history: list[dict] = []

    def dev_completions() -> list[str]:
        if multi_turn:
            return play(model, tokenizer, dev, domain.sealed_env)
        return generate(model, tokenizer, [t.prompt for t in dev], max_new)

    class StopAtTarget(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step % warm_cfg.eval_every and state.global_step < warm_cfg.max_steps:
                return control
            model.eval()
            tokenizer.padding_side = "left"
            outs = dev_completions()
            acc = sum(g.correct for g in grade_all(domain, outs, [t.answer for t in dev], [t.fmt for t in dev],
                                                   [t.prompt for t in dev])) / len(dev)
            model.train()
            history.append({"step": state.global_step, "dev_slice_accuracy": acc})
            if progress:
                progress(state.global_step, warm_cfg.max_steps, acc)
            if acc >= warm_cfg.target_accuracy:
                control.should_training_stop = True
            return control

    args = SFTConfig(
        output_dir=str(tmp / "_sft"), max_steps=warm_cfg.max_steps, per_device_train_batch_size=warm_cfg.batch_size,
        learning_rate=warm_cfg.learning_rate, lr_scheduler_type="constant_with_warmup", warmup_steps=50,
        logging_steps=50, save_strategy="no", report_to=[], use_cpu=True, bf16=False, seed=seed,
        completion_only_loss=True, max_length=model_cfg.max_positions, dataloader_num_workers=0,
        disable_tqdm=True, activation_checkpointing=False,  # TRL turns it on by default; 5x slower on CPU
        train_sampling_strategy="sequential",  # batches are pre-built by _length_bucketed
    )
    started = time.time()
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer,
                         callbacks=[StopAtTarget()])
    trainer.train()
    shutil.rmtree(tmp / "_sft", ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    meta = {"kind": "warm-policy", "domain": domain_name, "seed": seed, "model": asdict(model_cfg),
            "warmup": asdict(warm_cfg), "steps": history[-1]["step"] if history else 0, "history": history,
            "parameters": sum(p.numel() for p in model.parameters()), "seconds": round(time.time() - started, 1)}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
    if dest.exists():  # another process finished first: keep its copy
        shutil.rmtree(tmp)
    else:
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, dest)
    return dest


def main(argv: list[str]) -> int:
    """Child entry point: `python -m evotrainer.trainer.policy SPEC.json` warms up one policy."""
    from evotrainer.trainer.sandbox import progress

    spec = json.loads(Path(argv[0]).read_text())
    warm_up(spec["domain"], spec["seed"], ModelConfig(**spec["model"]), WarmupConfig(**spec["warmup"]),
            progress=lambda step, total, acc: progress(phase="warmup", step=step, total=total, accuracy=acc))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
