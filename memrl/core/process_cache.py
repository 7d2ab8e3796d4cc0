"""A per-process cache of costly objects, built on first use and shared by every caller in the process.

Per process, not shared further: verl calls its reward function and builds an agent loop per sample, in each of its
worker processes and Ray actors, and each of them builds its scorer, environment or chat-turn tokens once per
configuration and reuses it. These objects hold models, threads and event-loop state that cannot cross processes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ProcessCache(Generic[K, V]):
    """key -> the object `build()` made for it the first time the key was asked for."""

    def __init__(self) -> None:
        self._items: dict[K, V] = {}
        # Held while building: two threads asking for a new key at once build it once. `build` must not use this cache.
        self._lock = threading.Lock()

    def get(self, key: K, build: Callable[[], V]) -> V:
        """The object for `key`; `build()` makes it on the key's first use. A failed build caches nothing."""
        with self._lock:
            if key not in self._items:
                self._items[key] = build()
            return self._items[key]

    def __len__(self) -> int:
        return len(self._items)
