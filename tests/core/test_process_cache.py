from __future__ import annotations

import threading
import time

import pytest

from memrl.core.process_cache import ProcessCache


def test_each_key_is_built_once_and_shared() -> None:
    cache: ProcessCache[str, list[str]] = ProcessCache()
    built: list[str] = []

    def build(key: str) -> list[str]:
        built.append(key)
        return [key]

    first = cache.get("a", lambda: build("a"))
    assert cache.get("a", lambda: build("a")) is first
    assert cache.get("b", lambda: build("b")) == ["b"]
    assert built == ["a", "b"] and len(cache) == 2


def test_concurrent_first_uses_build_once() -> None:
    cache: ProcessCache[int, object] = ProcessCache()
    calls: list[int] = []

    def slow() -> object:
        calls.append(1)
        time.sleep(0.05)  # the other threads arrive while the first still builds
        return object()

    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(cache.get(0, slow))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len({id(g) for g in got}) == 1


def test_a_failed_build_caches_nothing() -> None:
    cache: ProcessCache[str, int] = ProcessCache()

    def broken() -> int:
        raise RuntimeError("no model")

    with pytest.raises(RuntimeError):
        cache.get("k", broken)
    assert len(cache) == 0 and cache.get("k", lambda: 3) == 3
