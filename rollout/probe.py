"""One real request to an OpenAI-compatible endpoint, with its key, before a long job depends on it.

A listing of models proves little (a proxy answers it without the key a chat needs), so the probe asks for one
token of a chat completion: an unreachable host, a refused key (HTTP 401/403), an unknown model name (404) or a
server that answers garbage all fail here, in one line naming the endpoint, in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from memrl.core.errors import BackendError
from memrl.rollout.base import Message, SamplingParams
from memrl.rollout.config import OpenAIModelConfig

PROBE_TIMEOUT_S = 15.0
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "0.0.0.0"})
_PROBE: list[Message] = [{"role": "user", "content": "Reply with the word ok."}]


@dataclass(frozen=True)
class Endpoint:
    """A model a job calls over HTTP, and the role it plays there (judge, user, teacher, outcome agent, ...)."""

    role: str
    model: OpenAIModelConfig

    @property
    def label(self) -> str:
        """How a message names it: role, URL and model, never its key."""
        return f"{self.role} at {self.model.endpoint} (model {self.model.model})"


def is_local(url: str) -> bool:
    """Whether `url` names this host (a loopback or any-address), which means another machine on every node."""
    return (urlsplit(url).hostname or "").lower() in LOCAL_HOSTS


def probe(endpoint: Endpoint, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Send one one-token chat completion with the endpoint's key; raise BackendError naming the role on failure."""
    from memrl.rollout.openai_http import OpenAIBackend

    cfg = endpoint.model
    key = cfg.api_key.get_secret_value() if cfg.api_key is not None else None
    backend = OpenAIBackend(cfg.model, cfg.endpoint, api_key=key, timeout=min(timeout, cfg.timeout), max_retries=0)
    try:
        backend.chat(_PROBE, SamplingParams(temperature=0.0, top_p=1.0, max_tokens=1))
    except BackendError as exc:
        raise BackendError(f"{endpoint.role}: {exc}") from None
    finally:
        backend.close()


def probe_all(endpoints: list[Endpoint], timeout: float = PROBE_TIMEOUT_S) -> list[str]:
    """One line per endpoint that fails its probe (each distinct endpoint and model asked once)."""
    problems: list[str] = []
    seen: set[tuple[str, str]] = set()
    for endpoint in endpoints:
        ident = (endpoint.model.endpoint.rstrip("/"), endpoint.model.model)
        if ident in seen:
            continue
        seen.add(ident)
        try:
            probe(endpoint, timeout)
        except BackendError as exc:
            problems.append(str(exc))
    return problems


def require_reachable(endpoints: list[Endpoint], timeout: float = PROBE_TIMEOUT_S) -> None:
    """Raise one BackendError listing every endpoint that fails its probe (a run checks this before it starts)."""
    problems = probe_all(endpoints, timeout)
    if problems:
        raise BackendError("endpoint check failed before training: " + "; ".join(problems))
