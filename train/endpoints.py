"""Every model a stage calls over HTTP, with the role it plays there: what a run probes before it starts and what
the placement plan and `memrl preflight` name.

A stage's schema holds its endpoint models in a few known places (the reward's judge and outcome agents, the collab
user); any other OpenAI-compatible model found in the stage is reported under its dotted key, so a new stage kind
is covered without a line here.

The probe: one real request to each endpoint, with its key, before a long job depends on it. A listing of models
proves little (a proxy answers it without the key a chat needs), so the probe asks for one token of a chat
completion: an unreachable host, a refused key (HTTP 401/403), an unknown model name (404) or a server that answers
garbage all fail here, in one line naming the endpoint, in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

from pydantic import BaseModel

from memrl.core.errors import BackendError, ConfigError
from memrl.rollout.base import Message, SamplingParams
from memrl.rollout.config import OpenAIModelConfig

M = TypeVar("M", bound=BaseModel)

# Dotted keys of a stage -> the role the model plays there (what placement and the probe call it).
ROLES = {
    "reward.judge.model": "judge",
    "reward.outcome.agent": "outcome agent",
    "reward.outcome.judge": "outcome judge",
    "env.user_model": "user",
    "collab.model": "teacher",  # reflection_data: the model that plays the sessions and writes the gold notes
}


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


def stage_models(stage: BaseModel) -> dict[str, Any]:
    """Every model config inside `stage` by role, whatever its backend (hf, openai, vllm)."""
    found: dict[str, Any] = {}
    _walk(stage, (), found)
    return found


def stage_endpoints(stage: BaseModel) -> list[Endpoint]:
    """The HTTP models `stage` calls, each with its role, in schema order."""
    return [
        Endpoint(role, model) for role, model in stage_models(stage).items() if isinstance(model, OpenAIModelConfig)
    ]


def _walk(node: BaseModel, path: tuple[str, ...], found: dict[str, Any]) -> None:
    for name in type(node).model_fields:
        value = getattr(node, name)
        key = (*path, name)
        if isinstance(value, BaseModel) and "backend" in type(value).model_fields:
            dotted = ".".join(key)
            found[ROLES.get(dotted, dotted)] = value
        elif isinstance(value, BaseModel):
            _walk(value, key, found)


def per_process(config: M, processes: int, where: str = "") -> M:
    """`config` with the `max_concurrency` of every HTTP model in it divided over `processes` processes that each
    hold their own client (TRL's ranks under accelerate), so that together they keep the recipe's bound, as verl's
    reward and agent-loop workers do. A bound smaller than the processes is refused in one line."""
    if processes <= 1:
        return config
    updates: dict[str, Any] = {}
    for name in type(config).model_fields:
        value, key = getattr(config, name), f"{where}.{name}" if where else name
        if isinstance(value, OpenAIModelConfig):
            each = value.max_concurrency // processes
            if each == 0:
                raise ConfigError(
                    f"{key}.max_concurrency {value.max_concurrency} is fewer requests than the {processes} training "
                    "processes that share it; raise it to at least their number"
                )
            updates[name] = value.model_copy(update={"max_concurrency": each})
        elif isinstance(value, BaseModel):
            divided = per_process(value, processes, key)
            if divided is not value:
                updates[name] = divided
    return config.model_copy(update=updates) if updates else config
