"""Typed configs of the LLM backends and sampling, as recipes write them."""

from __future__ import annotations

import urllib.parse
from typing import Annotated, Literal

from pydantic import Field, PositiveFloat, PositiveInt, SecretStr, field_validator
from pydantic_core import PydanticCustomError

from memrl.core.schema import StrictModel
from memrl.core.secrets import MASK
from memrl.rollout.base import SamplingParams

MAX_URL = 8192  # past what servers and proxies take in a request line
MASKS = frozenset({"**********", MASK})  # what pydantic dumps for a SecretStr, and what memrl.core.secrets writes


def _field_error(problem: str) -> PydanticCustomError:
    """A field's own check failing: describe_error puts the field's dotted key before `problem`."""
    return PydanticCustomError("config_field", "{problem}", {"problem": problem})


class HFModelConfig(StrictModel):
    """A transformers model loaded in-process (CPU or GPU)."""

    backend: Literal["hf"]
    model: str = Field(description="embedded model name, local path, or hub id")
    device: str = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    batch_size: PositiveInt = 8


class OpenAIModelConfig(StrictModel):
    """Any OpenAI-compatible endpoint: vllm serve, transformers serve, a hosted API."""

    backend: Literal["openai"]
    model: str
    endpoint: str = Field(description="base URL, e.g. http://127.0.0.1:8000/v1")
    api_key: SecretStr | None = None
    timeout: PositiveFloat = Field(default=120.0, le=86_400, description="seconds; what it bounds: `deadline`")
    max_retries: int = Field(default=4, ge=0, le=100)
    deadline: Literal["total", "progress"] = Field(
        default="total",
        description="total: `timeout` bounds each attempt, retried up to max_retries (an endpoint elsewhere); "
        "progress: requests stream and fail only after `timeout` seconds without a byte from the server (what memrl "
        "sets for a server it starts itself, so that a busy machine slows work, never fails it)",
    )
    max_concurrency: PositiveInt = Field(
        default=16,
        le=65_536,
        description="requests in flight at most (sync and async): the one bound, judges included; under verl it is "
        "divided over the reward / agent-loop workers, so the server sees this number",
    )

    @field_validator("endpoint")
    @classmethod
    def _callable_url(cls, url: str) -> str:
        """A URL the HTTP clients take; the clients' own refusals (a malformed IPv6 host, a URL past their length
        limit) are tracebacks from deep inside them."""
        if len(url) > MAX_URL:
            raise _field_error(f"a URL of {len(url)} characters (at most {MAX_URL})")
        try:
            parts = urllib.parse.urlsplit(url)
            parts.port  # noqa: B018 - a port that is no number, or past 65535, raises here
        except ValueError as exc:
            raise _field_error(f"not a URL ({exc}): give http(s)://HOST[:PORT]/v1") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise _field_error("not an http(s):// URL with a host: give http(s)://HOST[:PORT]/v1")
        return url

    @field_validator("api_key")
    @classmethod
    def _not_a_mask(cls, key: SecretStr | None) -> SecretStr | None:
        """A saved recipe holds a mask where a key was written in (keys never reach disk): sending it would fail as a
        wrong key, far from the cause."""
        if key is not None and key.get_secret_value() in MASKS:
            raise _field_error(
                "is the mask memrl saves in place of a key written into a recipe, not a key: give the key as "
                "${VARIABLE} (an environment variable), which is saved as a reference"
            )
        return key


class VLLMModelConfig(StrictModel):
    """vLLM engine in the current process (GPU machines)."""

    backend: Literal["vllm"]
    model: str
    tensor_parallel_size: PositiveInt = 1
    gpu_memory_utilization: float = Field(default=0.85, gt=0, le=1)
    max_model_len: PositiveInt | None = None
    dtype: str = "auto"


ModelConfig = Annotated[HFModelConfig | OpenAIModelConfig | VLLMModelConfig, Field(discriminator="backend")]


def model_from_spec(spec: str, max_concurrency: int = 32) -> ModelConfig:
    """`NAME` (embedded name, local path or hub id, served locally) or `NAME@URL` (an OpenAI-compatible endpoint)."""
    name, sep, url = spec.partition("@")
    if sep and url.startswith(("http://", "https://")):
        return OpenAIModelConfig(backend="openai", model=name, endpoint=url, max_concurrency=max_concurrency)
    return HFModelConfig(backend="hf", model=spec)


class SamplingConfig(StrictModel):
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_tokens: PositiveInt = 256
    stop: list[str] = Field(default_factory=list)
    seed: int | None = None

    def params(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_p, self.max_tokens, tuple(self.stop), self.seed)
