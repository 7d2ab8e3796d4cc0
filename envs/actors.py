"""What every environment driver shares: Ray start-up, local model servers, actor errors and safe resumption."""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from memrl.errors import ConfigError, MemrlError, first_line
from memrl.rollout.config import HFModelConfig, ModelConfig, OpenAIModelConfig, VLLMModelConfig
from memrl.rollout.serve import LocalServer, free_port, pick_engine, shared_server_args


def probe_ray(address: str | None) -> None:
    """Fail fast on a `host:port` where nothing listens: ray.init would keep retrying for minutes."""
    if not address or address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except (OSError, ValueError) as exc:
        raise MemrlError(f"cannot connect to the Ray cluster at {address}: {exc}") from exc


def start_ray(address: str | None, stack: contextlib.ExitStack) -> None:
    """Connect to `address` (or start a local Ray) unless Ray is up already; the stack shuts down what it started."""
    import ray

    if ray.is_initialized():
        return
    env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "TOKENIZERS_PARALLELISM": "false"}
    probe_ray(address)
    try:
        ray.init(address=address, include_dashboard=False, runtime_env={"env_vars": env})
    except (ConnectionError, RuntimeError) as exc:
        raise MemrlError(f"cannot connect to the Ray cluster at {address}: {first_line(exc)}") from exc
    stack.callback(ray.shutdown)


def actor_error_cause(exc: BaseException) -> BaseException:
    """The exception raised inside an actor, not Ray's wrapper around it."""
    return getattr(exc, "cause", None) or exc


T = TypeVar("T")


def next_finished(in_flight: dict[Any, T], name: Callable[[T], str]) -> tuple[T, Any]:
    """Wait for any in-flight actor call; pop it and return (its tag, its result).

    A failed call raises a one-line `MemrlError` naming the work (`name(tag)`) and the actor's own exception;
    whatever finished before is already on disk, so a rerun resumes from there.
    """
    import ray

    ready, _ = ray.wait(list(in_flight), num_returns=1)
    tag = in_flight.pop(ready[0])
    try:
        return tag, ray.get(ready[0])
    except Exception as exc:
        cause = actor_error_cause(exc)
        raise MemrlError(f"{name(tag)} failed: {first_line(cause)}") from cause


def endpoint_server(
    stack: contextlib.ExitStack, log_dir: Path, per_worker: int
) -> Callable[[ModelConfig | None], OpenAIModelConfig | None]:
    """A function mapping each model a run needs to an endpoint all workers share.

    An in-process model is served once (`transformers serve` with continuous batching on CPU, `vllm serve` with a
    GPU) so that requests from every worker batch together; an endpoint passes through with its share of the
    in-flight budget.
    """
    served: dict[str, OpenAIModelConfig] = {}

    def endpoint(cfg: ModelConfig | None) -> OpenAIModelConfig | None:
        if cfg is None:
            return None
        if isinstance(cfg, OpenAIModelConfig):
            return cfg.model_copy(update={"max_concurrency": per_worker})
        assert isinstance(cfg, HFModelConfig | VLLMModelConfig)
        if cfg.model not in served:
            extra = shared_server_args(pick_engine("auto"))
            log = log_dir / f"serve-{len(served)}.log"
            server = stack.enter_context(LocalServer(cfg.model, port=free_port(), log=log, extra_args=extra))
            served[cfg.model] = OpenAIModelConfig(
                backend="openai", model=server.name, endpoint=server.url, max_concurrency=per_worker
            )
        return served[cfg.model]

    return endpoint


def claim_output(out: Path, cfg: BaseModel, may_change: Collection[str]) -> None:
    """Save the run's config in `out`, refusing a folder that holds a run with another setup.

    Only the keys in `may_change` (how much to run, how the work is spread) may differ on resumption; anything
    else would mix sessions of two experiments in one file.
    """
    saved = out / "config.json"
    now = json.loads(cfg.model_dump_json())
    if saved.is_file():
        before = json.loads(saved.read_text())
        changed = sorted(k for k in now.keys() - set(may_change) if before.get(k) != now[k])
        if changed:
            raise ConfigError(f"{out} holds a run with different {', '.join(changed)}; use another --out")
    out.mkdir(parents=True, exist_ok=True)
    saved.write_text(cfg.model_dump_json(indent=2) + "\n")
