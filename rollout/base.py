"""The one small interface every LLM backend implements."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, TypedDict

from memrl.core.asyncs import in_own_thread

Role = Literal["system", "user", "assistant"]


class Message(TypedDict):
    role: Role
    content: str


Conversation = Sequence[Message]


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings shared by all backends; temperature 0 means greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None

    @property
    def decoding(self) -> str:
        """How texts are drawn, in the words a chart or report uses: "greedy" or "sampled at T"."""
        return "greedy" if self.temperature == 0 else f"sampled at {self.temperature:g}"


@dataclass(frozen=True)
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None = None


@dataclass
class Usage:
    """Token and request accounting, safe to update from threads and tasks."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    failures: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, completion: Completion) -> None:
        with self._lock:
            self.requests += 1
            self.prompt_tokens += completion.prompt_tokens
            self.completion_tokens += completion.completion_tokens

    def record_failure(self) -> None:
        with self._lock:
            self.failures += 1

    def as_dict(self) -> dict[str, int]:
        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "failures": self.failures,
        }


class ChatBackend(ABC):
    """Chat completion over one model: `chat`, async `achat`, and batched `generate`.

    Subclasses implement whichever of `generate` (native batching) or `achat` (native async I/O)
    suits them and get the others from these defaults.
    """

    name: str
    batch_size: int = 8  # conversations one `generate` call should get at a time to keep the backend busy

    def __init__(self) -> None:
        self.usage = Usage()

    def chat(self, messages: Conversation, params: SamplingParams | None = None) -> Completion:
        return self.generate([messages], params)[0]

    async def achat(self, messages: Conversation, params: SamplingParams | None = None) -> Completion:
        return await in_own_thread(self.chat, messages, params)

    @abstractmethod
    def generate(self, conversations: Sequence[Conversation], params: SamplingParams | None = None) -> list[Completion]:
        """One completion per conversation, in order."""

    def close(self) -> None:  # noqa: B027 - optional hook, most backends hold nothing to release
        """Release resources (connections, GPU memory)."""

    def __enter__(self) -> ChatBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
