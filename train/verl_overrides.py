"""A verl stage as Hydra overrides: values encoded as Hydra reads them, and the overrides of a GRPO stage (verl's
`ppo_trainer` config) and of an SFT stage (`sft_trainer_engine`). `verl_validate` checks them; `verl_command` runs them.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
from pathlib import Path
from typing import Any, Literal

from memrl.core.errors import ConfigError
from memrl.train.config import ClusterConfig, GRPOStage, LoraConfig, SFTStage

Logger = Literal["wandb", "console"]

REWARD_MODULE = "memrl.rewards.verl_reward"
# The async variant: verl's reward loop awaits it, and concurrent samples share one judge batch.
REWARD_FUNCTION = "compute_score_async"
REWARD_KWARGS = "reward.custom_reward_function.reward_kwargs"

# How each recipe loss aggregates token losses in verl (names from verl.trainer.ppo.core_algos.agg_loss).
LOSS_AGG_MODE = {"grpo": "seq-mean-token-mean", "dapo": "token-mean", "dr_grpo": "seq-mean-token-sum-norm"}
CHECKPOINT_SUBDIR = "checkpoints"

_PLAIN = re.compile(r"^[A-Za-z0-9_./:~+@-]+$")


# --- Hydra values -------------------------------------------------------------------------------------------------


def hydra_value(value: Any) -> str:
    """A Python value written as a Hydra override value (strings quoted only when they need it)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if _PLAIN.match(text) and text.lower() not in {"null", "true", "false"} and not _is_number(text):
        return text
    # Hydra's quoted string: backslashes before a quote (or the closing one) are doubled, quotes escaped, and
    # `\${` keeps OmegaConf from interpolating.
    escaped = re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), text)
    escaped = escaped.replace("${", "\\${")
    return f"'{escaped}'"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _kv(key: str, value: Any) -> str:
    return f"{key}={hydra_value(value)}"


def _lora(prefix: str, lora: LoraConfig) -> list[str]:
    """Rank, alpha and target modules under `prefix` (where verl's config keeps the model)."""
    targets = lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules)
    return [
        _kv(f"{prefix}lora_rank", lora.rank),
        _kv(f"{prefix}lora_alpha", lora.alpha),
        _kv(f"{prefix}target_modules", targets),
    ]


def _loggers(logger: Logger) -> list[str]:
    return ["console", "wandb"] if logger == "wandb" else ["console"]


def reward_path(remote: bool) -> str:
    """Where verl loads compute_score from: this install's file locally, the importable module on a cluster."""
    if remote:
        return f"pkg://{REWARD_MODULE}"
    spec = importlib.util.find_spec(REWARD_MODULE)
    if spec is None or spec.origin is None:
        raise ConfigError(f"{REWARD_MODULE} is not importable: the verl reward adapter is missing from this install")
    return str(Path(spec.origin).resolve())


def reward_kwargs(stage: GRPOStage) -> dict[str, Any]:
    """What verl passes to every reward call (`reward_kwargs`, read by memrl.rewards.verl_reward): the judge as a
    full JudgeConfig mapping, the weights and the length penalty. Never a secret: the judge's API key is left out (it
    would land in the command and verl's logs); `verl_command.secret_env` hands it to the job as MEMRL_JUDGE_API_KEY.
    """
    reward = stage.reward
    if reward.plain_text_notes:
        raise ConfigError("reward.plain_text_notes grades replies outside the JSON contract; verl training cannot")
    judge = reward.judge.model_dump(mode="json")
    if isinstance(judge.get("model"), dict) and "api_key" in judge["model"]:
        judge["model"]["api_key"] = None
    out: dict[str, Any] = {
        "judge": judge,
        "coverage_weight": reward.coverage_weight,
        "format_weight": reward.format_weight,
    }
    if reward.length_penalty is not None:
        out["length_penalty"] = reward.length_penalty.model_dump(mode="json")
    if "${" in json.dumps(out):
        # verl resolves its config twice; an escaped `${` becomes a live interpolation the second time.
        raise ConfigError("the reward config holds `${`, which verl would read as an interpolation")
    return out


# --- overrides ----------------------------------------------------------------------------------------------------


def grpo_overrides(
    stage: GRPOStage,
    *,
    model_path: str,
    data_dir: Path,
    out_dir: Path,
    experiment: str,
    project: str = "memrl",
    logger: Logger = "console",
    lora_adapter_path: str | None = None,
    resume: bool = True,
    seed: int = 0,
) -> list[str]:
    """Hydra overrides for `python -m verl.trainer.main_ppo` (config `ppo_trainer`); `stage.overrides` come last."""
    if stage.rollouts < 2:
        raise ConfigError("GRPO needs at least 2 rollouts per prompt: a group of one has no relative advantage")
    remote = stage.cluster.ray_address is not None
    mb = stage.micro_batch_size
    gpus = stage.cluster.gpus_per_node
    out: list[str] = [
        _kv("algorithm.adv_estimator", "grpo"),
        _kv("algorithm.use_kl_in_reward", False),
        # Dr. GRPO drops the std scaling of the group advantage along with the per-sequence length normalisation.
        _kv("algorithm.norm_adv_by_std_in_grpo", stage.loss != "dr_grpo"),
        _kv("data.train_files", str(data_dir / "rl" / "train.parquet")),
        _kv("data.val_files", str(data_dir / "rl" / "eval.parquet")),
        _kv("data.train_batch_size", stage.batch_size),
        _kv("data.max_prompt_length", stage.max_prompt_length),
        _kv("data.max_response_length", stage.max_response_length),
        # A prompt longer than the budget is dropped up front instead of failing the run mid-epoch.
        _kv("data.filter_overlong_prompts", True),
        # verl's default (null) seeds the shuffling sampler from the clock: a resumed run would see another order.
        _kv("data.seed", seed),
        _kv("actor_rollout_ref.model.path", model_path),
        _kv("actor_rollout_ref.actor.optim.lr", stage.lr),
        # One optimizer step per training step: the mini-batch is the whole batch of prompts.
        _kv("actor_rollout_ref.actor.ppo_mini_batch_size", stage.batch_size),
        _kv("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", mb),
        _kv("actor_rollout_ref.actor.loss_agg_mode", LOSS_AGG_MODE[stage.loss]),
        _kv("actor_rollout_ref.actor.entropy_coeff", 0),
        _kv("actor_rollout_ref.actor.use_kl_loss", stage.kl_coef > 0),
    ]
    if stage.kl_coef > 0:
        out += [
            _kv("actor_rollout_ref.actor.kl_loss_coef", stage.kl_coef),
            _kv("actor_rollout_ref.actor.kl_loss_type", "low_var_kl"),
        ]
    if stage.loss == "dr_grpo":
        # A constant horizon: the sum over tokens is divided by the response budget, whatever the batch's padding.
        out.append(_kv("actor_rollout_ref.actor.loss_scale_factor", stage.max_response_length))
    out += [
        _kv("actor_rollout_ref.rollout.name", "vllm"),
        _kv("actor_rollout_ref.rollout.n", stage.rollouts),
        _kv("actor_rollout_ref.rollout.temperature", stage.temperature),
        _kv("actor_rollout_ref.rollout.tensor_model_parallel_size", 2 if gpus % 2 == 0 else 1),
        _kv("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", mb),
        _kv("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", mb),
    ]
    if stage.lora is not None:
        out += [
            *_lora("actor_rollout_ref.model.", stage.lora),
            # vLLM must load the real base weights (the adapter alone is synced each step), one layer at a time.
            _kv("actor_rollout_ref.rollout.load_format", "safetensors"),
            _kv("actor_rollout_ref.rollout.layered_summon", True),
        ]
        if lora_adapter_path is not None:
            out.append(_kv("actor_rollout_ref.model.lora_adapter_path", lora_adapter_path))
    elif lora_adapter_path is not None:
        raise ConfigError("an SFT LoRA adapter can only start a GRPO stage that trains LoRA too (set stages.*.lora)")
    out += [
        _kv("reward.custom_reward_function.path", reward_path(remote)),
        _kv("reward.custom_reward_function.name", REWARD_FUNCTION),
        *("+" + _kv(f"{REWARD_KWARGS}.{key}", value) for key, value in reward_kwargs(stage).items()),
        _kv("trainer.total_training_steps", stage.max_steps),
        # Every epoch has at least one step, so this many epochs never stops the run before max_steps.
        _kv("trainer.total_epochs", stage.max_steps),
        *_trainer_common(stage.checkpoints.save_steps, stage.cluster, out_dir, experiment, project, logger, resume),
    ]
    return out + list(stage.overrides)


def sft_overrides(
    stage: SFTStage,
    *,
    model_path: str,
    data_dir: Path,
    out_dir: Path,
    experiment: str,
    project: str = "memrl",
    logger: Logger = "console",
    resume: bool = True,
) -> list[str]:
    """Hydra overrides for verl's SFT trainer (config `sft_trainer_engine`); `stage.overrides` come last."""
    world = stage.cluster.nnodes * stage.cluster.gpus_per_node
    if stage.batch_size % world or (stage.batch_size // world) % stage.micro_batch_size:
        raise ConfigError(
            f"verl SFT: batch_size {stage.batch_size} must split evenly over {world} GPUs "
            f"and then into micro batches of {stage.micro_batch_size}"
        )
    if stage.max_steps is None and stage.epochs != int(stage.epochs):
        raise ConfigError(f"verl SFT counts whole epochs; epochs {stage.epochs} needs max_steps instead")
    out = [
        _kv("data.train_files", str(data_dir / "sft" / "train.parquet")),
        _kv("data.val_files", str(data_dir / "sft" / "eval.parquet")),
        _kv("data.messages_key", "messages"),
        _kv("data.train_batch_size", stage.batch_size),
        _kv("data.micro_batch_size_per_gpu", stage.micro_batch_size),
        # Fixed micro batches, as the recipe states them; verl's default packs by token budget instead.
        _kv("data.use_dynamic_bsz", False),
        _kv("data.max_length", stage.max_length),
        _kv("data.truncation", "error"),
        _kv("model.path", model_path),
    ]
    if stage.lora is not None:
        out += _lora("model.", stage.lora)
    out += [
        _kv("optim.lr", stage.lr),
        _kv("optim.lr_warmup_steps_ratio", stage.warmup_ratio),
        _kv("trainer.total_epochs", math.ceil(stage.epochs)),
    ]
    if stage.max_steps is not None:
        out.append(_kv("trainer.total_training_steps", stage.max_steps))
    out += _trainer_common(stage.checkpoints.save_steps, stage.cluster, out_dir, experiment, project, logger, resume)
    return out + list(stage.overrides)


def _trainer_common(
    save_steps: int,
    cluster: ClusterConfig,
    out_dir: Path,
    experiment: str,
    project: str,
    logger: Logger,
    resume: bool,
) -> list[str]:
    return [
        _kv("trainer.save_freq", save_steps),
        _kv("trainer.test_freq", save_steps),
        _kv("trainer.default_local_dir", str(out_dir / CHECKPOINT_SUBDIR)),
        # auto: continue from the newest global_step_N under default_local_dir when there is one.
        _kv("trainer.resume_mode", "auto" if resume else "disable"),
        _kv("trainer.project_name", project),
        _kv("trainer.experiment_name", experiment),
        _kv("trainer.logger", _loggers(logger)),
        _kv("trainer.nnodes", cluster.nnodes),
        _kv("trainer.n_gpus_per_node", cluster.gpus_per_node),
    ]
