"""One sentence-embedding model per process, with a text -> vector cache.

The offline judge runs inside GRPO on CPU, where the same enforcement utterances and stock phrases come back in
every group of rollouts; caching their vectors skips most of the encoder work, and also makes a text's vector
independent of which batch it was first encoded in.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from memrl.core import models


class Embedder:
    """Unit-norm float32 vectors for texts; thread-safe (verl calls sync reward functions from a thread pool)."""

    def __init__(self, model: str, batch_size: int = 64, cache_size: int = 50_000) -> None:
        from sentence_transformers import SentenceTransformer

        self.name = model
        self.batch_size = batch_size
        self._model: Any = SentenceTransformer(models.resolve(model), device="cpu")
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()  # one encode at a time: two would only fight over the same cores

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), dim) matrix; each distinct uncached text is encoded once, all in one batched call."""
        with self._lock:
            todo = list(dict.fromkeys(t for t in texts if t not in self._cache))
            if todo:
                vectors = self._model.encode(
                    todo, batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True
                )
                for text, vector in zip(todo, vectors, strict=True):
                    self._cache[text] = vector.astype(np.float32)
            if not texts:
                return np.zeros((0, self.dim), dtype=np.float32)
            out = np.stack([self._cache[t] for t in texts])
            for text in texts:
                self._cache.move_to_end(text)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
            return out

    @property
    def dim(self) -> int:
        return int(self._model.get_embedding_dimension())


@lru_cache(maxsize=4)
def get_embedder(model: str = "all-minilm-l6-v2") -> Embedder:
    """The process-wide embedder for `model` (loading MiniLM costs seconds; do it once)."""
    return Embedder(model)
