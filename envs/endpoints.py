"""The model endpoints a run's workers share: an in-process model served once, an endpoint passed through."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memrl.rollout.config import HFModelConfig, ModelConfig, OpenAIModelConfig, VLLMModelConfig
from memrl.rollout.serve import LocalServer, free_port, pick_engine, shared_server_args

# How a worker waits on a server this run started. transformers serve queues whatever it is sent and finishes a
# non-streamed request whose client gave up, so a timeout plus a retry ran it twice and load lengthened the queue:
# its requests stream (the server stops a streamed request whose connection closed) and only the server's silence
# fails them. vLLM aborts any request whose connection closes: a timeout and a retry, as for any endpoint.
LOCAL_DEADLINES: dict[str, dict[str, Any]] = {
    "transformers": {"deadline": "progress", "timeout": 600.0},
    "vllm": {},
}


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
            engine = pick_engine("auto")
            log = log_dir / f"serve-{len(served)}.log"
            server = LocalServer(cfg.model, port=free_port(), log=log, extra_args=shared_server_args(engine))
            stack.enter_context(server)
            served[cfg.model] = OpenAIModelConfig(
                backend="openai",
                model=server.name,
                endpoint=server.url,
                max_concurrency=per_worker,
                **LOCAL_DEADLINES[engine],
            )
        return served[cfg.model]

    return endpoint
