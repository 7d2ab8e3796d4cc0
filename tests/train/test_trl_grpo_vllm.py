"""The grpo stage's `vllm` key under TRL: GRPOConfig fields TRL 1.16 accepts, and one line where vLLM is missing."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from trl import GRPOConfig

from memrl.core.errors import ConfigError
from memrl.train.config import GRPOStage
from memrl.train.trl.grpo import require_vllm, vllm_args


def stage(**kwargs: object) -> GRPOStage:
    return GRPOStage.model_validate({"kind": "grpo", "model": "policy", "data": "data", **kwargs})


def test_vllm_key_gives_colocated_generation_that_grpo_config_accepts(tmp_path: Path) -> None:
    assert vllm_args(stage()) == {}  # default: TRL's own model.generate
    args = vllm_args(stage(vllm=True, max_prompt_length=1024, max_response_length=512))
    config = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", **args)
    assert (config.use_vllm, config.vllm_mode, config.vllm_max_model_length) == (True, "colocate", 1536)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_asked_for_without_vllm_is_one_line() -> None:
    require_vllm(stage(), "grpo")  # not asked for: nothing to check
    with pytest.raises(ConfigError, match=r"^stages\.grpo\.vllm: vLLM is not installed") as err:
        require_vllm(stage(vllm=True), "grpo")
    assert "\n" not in str(err.value)
