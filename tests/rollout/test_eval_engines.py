"""`eval reflector` builds one in-process engine per model (base, SFT, GRPO): each must be freed before the next, and
calls into one engine take turns.

vLLM does not run on CPU, so the vLLM backend's close is checked against a stand-in with vLLM 0.24's shape (the
`LLM.llm_engine.engine_core` client whose `shutdown` stops the engine-core process, and
`vllm.distributed.cleanup_dist_env_and_memory`); where vLLM is installed the same names are checked on the real one.
"""

from __future__ import annotations

import asyncio
import sys
import time
from types import ModuleType, SimpleNamespace

import pytest

from memrl.rollout.vllm_local import VLLMBackend


def _stand_in(log: list[str]) -> tuple[ModuleType, ModuleType]:
    vllm, dist = ModuleType("vllm"), ModuleType("vllm.distributed")

    class LLM:
        def __init__(self, model: str, **_: object) -> None:
            log.append(f"build {model}")
            core = SimpleNamespace(shutdown=lambda timeout=None: log.append(f"shutdown {model}"))
            self.llm_engine = SimpleNamespace(engine_core=core)

    vllm.LLM = LLM  # type: ignore[attr-defined]
    vllm.distributed = dist  # type: ignore[attr-defined]
    dist.cleanup_dist_env_and_memory = lambda shutdown_ray=False: log.append("cleanup")  # type: ignore[attr-defined]
    return vllm, dist


def test_each_vllm_engine_is_shut_down_before_the_next_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[str] = []
    vllm, dist = _stand_in(log)
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.distributed", dist)
    for model in ("base", "sft"):
        backend = VLLMBackend(model)
        backend.close()
        backend.close()  # a second close is harmless
        assert not hasattr(backend, "engine")  # no reference left to keep the engine alive
    assert log == ["build base", "shutdown base", "cleanup", "build sft", "shutdown sft", "cleanup"]


def test_concurrent_vllm_calls_take_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    # `achat` runs each call in its own thread; the offline engine must still see one `chat` at a time.
    vllm, dist = _stand_in([])
    inside: list[int] = []

    def chat(conversations: list, sampling: dict, use_tqdm: bool) -> list:
        inside.append(1)
        overlapped = len(inside) > 1
        time.sleep(0.02)
        inside.pop()
        assert not overlapped, "two chat calls ran at once"
        text = conversations[0][-1]["content"].upper()
        return [
            SimpleNamespace(
                prompt_token_ids=[1], outputs=[SimpleNamespace(text=text, token_ids=[2], finish_reason="stop")]
            )
        ]

    vllm.SamplingParams = lambda **kw: kw  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.distributed", dist)
    backend = VLLMBackend("base")
    backend.engine.chat = chat  # type: ignore[attr-defined]

    async def ask() -> list[str]:
        done = await asyncio.gather(*(backend.achat([{"role": "user", "content": w}]) for w in "abcd"))
        return [c.text for c in done]

    assert asyncio.run(ask()) == ["A", "B", "C", "D"]
    assert backend.usage.requests == 4


def test_the_real_vllm_has_the_cleanup_this_relies_on() -> None:
    pytest.importorskip("vllm")  # GPU machines only
    from vllm.distributed import cleanup_dist_env_and_memory
    from vllm.v1.engine.core_client import EngineCoreClient

    assert callable(cleanup_dist_env_and_memory) and callable(EngineCoreClient.shutdown)
