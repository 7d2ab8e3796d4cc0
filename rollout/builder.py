"""Build a backend from its recipe config: one builder per backend kind, no if-chains."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from memrl.core import models
from memrl.core.errors import ModelNotFoundError, first_line
from memrl.rollout.base import ChatBackend
from memrl.rollout.config import HFModelConfig, ModelConfig, OpenAIModelConfig, VLLMModelConfig


def _hf(cfg: HFModelConfig) -> ChatBackend:
    path = models.resolve(cfg.model)  # a bad name or a broken folder fails here, before transformers loads
    if Path(path).is_dir():
        models.check_chat_template(Path(path))

    from memrl.rollout.hf_local import HFBackend

    try:
        return HFBackend(path, device=cfg.device, dtype=cfg.dtype, batch_size=cfg.batch_size)
    except Exception as exc:  # whatever a model the checks passed still makes transformers raise: one line
        raise ModelNotFoundError(f"cannot load model {cfg.model!r}: {type(exc).__name__}: {first_line(exc)}") from exc


def _openai(cfg: OpenAIModelConfig) -> ChatBackend:
    from memrl.rollout.openai_http import OpenAIBackend

    # An embedded alias (smollm2) goes out under its canonical name, the one `memrl serve` exposes.
    embedded = models.lookup(cfg.model)
    return OpenAIBackend(
        model=embedded.name if embedded else cfg.model,
        base_url=cfg.endpoint,
        api_key=cfg.api_key.get_secret_value() if cfg.api_key else None,
        timeout=cfg.timeout,
        max_retries=cfg.max_retries,
        max_concurrency=cfg.max_concurrency,
        deadline=cfg.deadline,
    )


def _vllm(cfg: VLLMModelConfig) -> ChatBackend:
    from memrl.rollout.vllm_local import VLLMBackend, import_vllm

    import_vllm()  # fail on a missing vLLM before preparing any model
    return VLLMBackend(
        models.resolve(cfg.model),
        tensor_parallel_size=cfg.tensor_parallel_size,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        max_model_len=cfg.max_model_len,
        dtype=cfg.dtype,
    )


BUILDERS: dict[type[Any], Callable[[Any], ChatBackend]] = {
    HFModelConfig: _hf,
    OpenAIModelConfig: _openai,
    VLLMModelConfig: _vllm,
}


def build_backend(cfg: ModelConfig) -> ChatBackend:
    return BUILDERS[type(cfg)](cfg)
