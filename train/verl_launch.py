"""verl on GPU clusters: a stage becomes Hydra overrides, checked against verl's own config on CPU, then a command.

The public face of three modules, one job each: `verl_overrides` (Hydra values and the overrides of a GRPO or SFT
stage), `verl_validate` (the overrides checked against verl's config) and `verl_command` (the argv, the secrets it
passes by reference, running and logging).
"""

from __future__ import annotations

from memrl.train.rewards.verl import REWARD_MODULE, reward_path
from memrl.train.verl_command import (
    ENV_PASSTHROUGH,
    JUDGE_KEY_ENV,
    PPO_ENTRY,
    SFT_ENTRY,
    SFT_RAY_ENTRY,
    RaySubmission,
    format_command,
    job_env,
    refuse_local_endpoints,
    run_verl,
    secret_env,
    unscored_job_env,
    verl_command,
)
from memrl.train.verl_overrides import (
    CHECKPOINT_SUBDIR,
    LOSS_AGG_MODE,
    REWARD_FUNCTION,
    REWARD_KWARGS,
    Logger,
    grpo_overrides,
    hydra_value,
    reward_kwargs,
    reward_workers,
    sft_overrides,
    verl_modules,
)
from memrl.train.verl_validate import (
    PPO_CONFIG,
    SFT_CONFIG,
    VLLM_MAX_LORA_RANK,
    compose,
    config_dir,
    validate_overrides,
)

__all__ = [
    "CHECKPOINT_SUBDIR",
    "ENV_PASSTHROUGH",
    "JUDGE_KEY_ENV",
    "LOSS_AGG_MODE",
    "PPO_CONFIG",
    "PPO_ENTRY",
    "REWARD_FUNCTION",
    "REWARD_KWARGS",
    "REWARD_MODULE",
    "SFT_CONFIG",
    "SFT_ENTRY",
    "SFT_RAY_ENTRY",
    "VLLM_MAX_LORA_RANK",
    "Logger",
    "RaySubmission",
    "compose",
    "config_dir",
    "format_command",
    "grpo_overrides",
    "hydra_value",
    "job_env",
    "refuse_local_endpoints",
    "reward_kwargs",
    "reward_path",
    "reward_workers",
    "run_verl",
    "secret_env",
    "sft_overrides",
    "unscored_job_env",
    "validate_overrides",
    "verl_command",
    "verl_modules",
]
