"""A verl stage as Hydra overrides: values encoded as Hydra reads them, and the overrides of a GRPO stage (verl's
`ppo_trainer` config) and of an SFT stage (`sft_trainer_engine`). `validate` checks them; `command` runs them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Required, TypedDict, Unpack

from memrl.core.errors import ConfigError
from memrl.core.secrets import redact, register, url_credentials
from memrl.rewards.config import JudgeConfig
from memrl.rollout.config import VLLMModelConfig
from memrl.train.config import ClusterConfig, GRPOStage, LoggingTarget, LoraConfig, PolicyOptimStage, SFTStage
from memrl.train.endpoints import stage_endpoints
from memrl.train.placement import rollout_tp, trainer_cluster
from memrl.train.verl.metrics import tracking_env
from memrl.train.verl.rewards import ADV_ESTIMATOR, ADV_MODULE, reward_path

Logger = Literal["wandb", "console"]

# The async variant: verl's reward loop awaits it, and concurrent samples share one judge batch.
REWARD_FUNCTION = "compute_score_async"
REWARD_KWARGS = "reward.custom_reward_function.reward_kwargs"
RUNTIME_ENV = "ray_kwargs.ray_init.runtime_env.env_vars"  # what every Ray process of a GRPO run gets
MODULES_ENV = "VERL_USE_EXTERNAL_MODULES"  # verl imports each (comma-separated) on `import verl`, in every process
COMPAT_MODULE = "memrl.train.verl.compat"  # lets verl build models beside TRL 1.16: first in every verl job
# verl's FSDP optimizer schedules a constant or a cosine learning rate after the warm-up, nothing else.
LR_SCHEDULERS = {"constant": "constant", "cosine": "cosine"}

# How each recipe loss aggregates token losses in verl (names from verl.trainer.ppo.core_algos.agg_loss).
LOSS_AGG_MODE = {"grpo": "seq-mean-token-mean", "dapo": "token-mean", "dr_grpo": "seq-mean-token-sum-norm"}
CHECKPOINT_SUBDIR = "checkpoints"
# verl's HFModelConfig asks for flash_attention_2, which the GPU set leaves out (no flash-attn wheel for its torch):
# every model verl trains or scores loads with PyTorch's SDPA. Padding stays removed: transformers turns the packed
# sequence's restarting position_ids into a per-sequence causal mask (docs/training.md, "Attention").
ATTENTION = "sdpa"
REWARD_WORKERS = 8  # verl 0.9.1's reward.num_workers
# Where verl 0.9.1 reads how many checkpoints to keep: per role in ppo_trainer (the critic key is harmless without a
# critic), one key in sft_trainer_engine.
PPO_KEEP = ("trainer.max_actor_ckpt_to_keep", "trainer.max_critic_ckpt_to_keep")
SFT_KEEP = ("trainer.max_ckpt_to_keep",)

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


def kv(key: str, value: Any) -> str:
    """One Hydra override, `key=value`."""
    return f"{key}={hydra_value(value)}"


def _lora(prefix: str, lora: LoraConfig) -> list[str]:
    """Rank, alpha and target modules under `prefix` (where verl's config keeps the model)."""
    targets = lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules)
    return [
        kv(f"{prefix}lora_rank", lora.rank),
        kv(f"{prefix}lora_alpha", lora.alpha),
        kv(f"{prefix}target_modules", targets),
    ]


def _attention(prefix: str) -> list[str]:
    """The attention kernel and the packed (padding-free) forward of the model verl keeps under `prefix`."""
    return [
        "+" + kv(f"{prefix}override_config.attn_implementation", ATTENTION),
        kv(f"{prefix}use_remove_padding", True),
    ]


def _loggers(logger: Logger) -> list[str]:
    """Always verl's `file` logger too: its metrics JSONL in the stage folder is what memrl draws the curves from."""
    return ["console", "file", "wandb"] if logger == "wandb" else ["console", "file"]


# --- micro batches by tokens -------------------------------------------------------------------------------------

ACTOR_TOKENS = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"  # the log-prob passes follow it (oc.select)
SFT_TOKENS = "data.max_token_len_per_gpu"


@dataclass(frozen=True)
class TokenBudget:
    """verl's dynamic batch size: each GPU's micro batches are packed with whole samples up to `per_gpu` tokens.

    The budget is derived from the lengths: `micro_batch_size` samples of the longest length the stage allows, the
    recipe's worst case, unless the stage's overrides set it. A micro-step then never holds more tokens (memory, and
    under SDPA the packed row's attention) than a fixed micro batch of full-length samples, but shorter samples share
    one instead of each taking a padded slot. `samples` is what one update hands each GPU."""

    longest: int  # tokens of the longest sample: prompt + response budget (SFT: max_length)
    lengths: str  # how `longest` is made, in words
    micro: int  # the recipe's micro_batch_size
    per_gpu: int
    samples: int  # per GPU per update
    gpus: int
    given: bool  # set by the stage's overrides

    def lines(self) -> list[str]:
        rule = "set by the overrides" if self.given else f"{self.micro} (micro_batch_size) x {self.longest}"
        fit = self.per_gpu // self.longest
        longest = -(-self.samples // fit)  # ceil: micro-steps when every sample is the longest
        half = -(-self.samples * self.longest // (2 * self.per_gpu))  # ... when they average half of it
        return [
            f"micro batches by tokens (use_dynamic_bsz): {self.per_gpu} tokens per GPU = {rule}; the longest sample "
            f"is {self.longest} = {self.lengths}",
            f"  an update is {self.samples} samples per GPU ({self.gpus} GPUs): {longest} micro-steps when every "
            f"sample is that long, about {half} when they average half of it (fixed micro batches of {self.micro}: "
            f"{-(-self.samples // self.micro)} whatever their length)",
        ]


def token_budget(
    longest: int, lengths: str, micro: int, samples: int, gpus: int, overrides: Sequence[str], key: str
) -> TokenBudget:
    """The budget a stage packs its micro batches to; one that cannot hold its longest sample is refused."""
    given = override_int(list(overrides), key)
    per_gpu = given if given is not None else micro * longest
    if per_gpu < longest:
        raise ConfigError(f"{key}={per_gpu} cannot hold the longest sample ({longest} tokens = {lengths})")
    return TokenBudget(longest, lengths, micro, per_gpu, samples, gpus, given is not None)


def policy_budget(stage: PolicyOptimStage) -> TokenBudget:
    """A GRPO stage's budget: one update is batch_size x rollouts samples over the trainer's GPUs."""
    gpus = stage.cluster.nnodes * trainer_cluster(stage).gpus_per_node
    longest = stage.max_prompt_length + stage.response_budget
    lengths = f"{stage.max_prompt_length} prompt + {stage.response_budget} response"
    samples = -(-stage.batch_size * stage.rollouts // gpus)
    return token_budget(longest, lengths, stage.micro_batch_size, samples, gpus, stage.overrides, ACTOR_TOKENS)


def sft_budget(stage: SFTStage) -> TokenBudget:
    """An SFT stage's budget: one update is batch_size sequences of up to max_length over the trainer's GPUs."""
    gpus = stage.cluster.nnodes * trainer_cluster(stage).gpus_per_node
    samples = -(-stage.batch_size // gpus)
    lengths = "max_length"
    return token_budget(stage.max_length, lengths, stage.micro_batch_size, samples, gpus, stage.overrides, SFT_TOKENS)


# --- concurrency over verl's workers ----------------------------------------------------------------------------


def override_int(overrides: list[str], key: str) -> int | None:
    """The value a stage's own overrides give `key` (the last one, as Hydra keeps it), if any."""
    found = [o.partition("=")[2] for o in overrides if o.lstrip("+~").partition("=")[0] == key]
    if not found:
        return None
    try:
        return int(found[-1])
    except ValueError:
        raise ConfigError(f"overrides: {key}={found[-1]} is not a whole number") from None


def worker_count(default: int, bounds: list[int], overrides: list[str], key: str) -> int:
    """How many workers verl starts for `key`: the stage's own override, else no more than the smallest bound (a
    worker with a share of 0 requests would be no worker), else verl's default."""
    chosen = override_int(overrides, key)
    if chosen is not None:
        if bounds and chosen > min(bounds):
            raise ConfigError(f"{key}={chosen} is more workers than the {min(bounds)} requests in flight allowed")
        return chosen
    return min([default, *bounds])


def per_worker(mapping: dict[str, Any], workers: int) -> dict[str, Any]:
    """An endpoint model's mapping with its `max_concurrency` split over `workers` processes, each of which holds
    its own client: together they keep the recipe's bound."""
    if isinstance(mapping.get("max_concurrency"), int):
        mapping["max_concurrency"] = mapping["max_concurrency"] // workers
    return mapping


def reward_workers(stage: GRPOStage) -> int:
    """verl's reward workers for the stage (`reward.num_workers`)."""
    bounds = [e.model.max_concurrency for e in stage_endpoints(stage)]  # the judge's and the outcome reward's
    return worker_count(REWARD_WORKERS, bounds, list(stage.overrides), "reward.num_workers")


def reward_kwargs(stage: GRPOStage, data_dir: Path | None = None) -> dict[str, Any]:
    """What verl passes to every reward call (`reward_kwargs`, read by memrl.train.verl.rewards): the judge as a
    full JudgeConfig mapping (or, for a judge verl hosts, `judge: llm` with no endpoint: the reward function then asks
    verl's reward router), the weights, the length penalty and the outcome reward (its `data` defaulting to the
    stage's `data_dir`). Never a secret: API keys are left out (they would land in the command and verl's logs);
    `command.secret_env` hands them to the job in the environment. Each endpoint's `max_concurrency` is
    divided over verl's `reward_workers`, each of which holds its own scorer.
    """
    reward, workers = stage.reward, reward_workers(stage)
    if reward.plain_text_notes:
        raise ConfigError("reward.plain_text_notes grades replies outside the JSON contract; verl training cannot")
    if hosts_judge(stage):
        out = _hosted_judge_kwargs(reward.judge)
    else:
        judge = _judge_mapping(reward.judge)
        if isinstance(judge.get("model"), dict):
            per_worker(judge["model"], workers)
        out = {"judge": judge}
    # The config's own dump, as verl's reward function validates it back: every key but the judge (above) and
    # plain_text_notes (refused above), unset blocks left out.
    dump = reward.model_dump(mode="json", exclude={"judge", "plain_text_notes"})
    out |= {key: value for key, value in dump.items() if value is not None}
    if isinstance(outcome := out.get("outcome"), dict):
        if outcome["data"] is None and data_dir is not None:
            outcome["data"] = str(data_dir)
        _keyless(outcome, "agent", "judge")
        for role in ("agent", "judge"):
            if isinstance(outcome.get(role), dict):
                per_worker(outcome[role], workers)
    if "${" in json.dumps(out):
        # verl resolves its config twice; an escaped `${` becomes a live interpolation the second time.
        raise ConfigError("the reward config holds `${`, which verl would read as an interpolation")
    return out


def _keyless(mapping: dict[str, Any], *roles: str) -> dict[str, Any]:
    """`mapping` with the API key of each role's model (an endpoint) set to None; an endpoint whose URL holds a
    credential is refused, since verl prints and saves its config."""
    for role in roles:
        if not isinstance(mapping.get(role), dict):
            continue
        endpoint = mapping[role].get("endpoint")
        if isinstance(endpoint, str) and (url_credentials(endpoint) or redact(endpoint) != endpoint):
            register(url_credentials(endpoint))  # masked in the line below
            raise ConfigError(
                f"{role} endpoint {redact(endpoint)}: a credential in the URL would go into verl's printed config; "
                "give it as the model's api_key, which reaches verl's workers by their environment, not the config"
            )
        if "api_key" in mapping[role]:
            mapping[role]["api_key"] = None
    return mapping


def _judge_mapping(judge: JudgeConfig) -> dict[str, Any]:
    return _keyless(judge.model_dump(mode="json"), "model")


# --- a judge verl hosts -------------------------------------------------------------------------------------------


def hosts_judge(stage: GRPOStage) -> bool:
    """A vLLM judge model in a verl stage is served by verl itself (`reward.reward_model`), colocated on the
    training GPUs: no endpoint to start beside the job, and training keeps every GPU."""
    return isinstance(stage.reward.judge.model, VLLMModelConfig)


def _hosted_judge_kwargs(judge: JudgeConfig) -> dict[str, Any]:
    """memrl.train.verl.rewards's shorthand with no endpoint and no model name, so that it asks verl's router under
    the name verl serves the model by. The shorthand carries no sampling, few-shot or cache switch: refuse those."""
    default = JudgeConfig(kind="llm", model=judge.model)
    for name in ("sampling", "few_shot", "cache"):
        if getattr(judge, name) != getattr(default, name):
            raise ConfigError(f"reward.judge.{name}: a judge verl hosts (model.backend vllm) uses the default")
    out: dict[str, Any] = {"judge": "llm", "retries": judge.retries}
    if judge.cache_dir is not None:
        out["cache_dir"] = judge.cache_dir
    return out


def _hosted_judge(model: VLLMModelConfig, cluster: ClusterConfig) -> list[str]:
    """verl 0.9.1's generative reward model: vLLM replicas in the training pool (asleep while the policy trains),
    behind a router whose address reaches the reward function as `reward_router_address`."""
    gpus = cluster.nnodes * cluster.gpus_per_node
    if gpus % model.tensor_parallel_size:
        raise ConfigError(
            f"reward.judge.model.tensor_parallel_size {model.tensor_parallel_size} must divide the stage's {gpus} GPUs"
        )
    prefix = "reward.reward_model."
    out = [
        kv(f"{prefix}enable", True),
        kv(f"{prefix}enable_resource_pool", False),
        kv(f"{prefix}model_path", model.model),
        kv(f"{prefix}rollout.name", "vllm"),
        kv(f"{prefix}rollout.tensor_model_parallel_size", model.tensor_parallel_size),
    ]
    # verl's own default (0.5) leaves room for the policy's weights beside it, unless the recipe says otherwise.
    if "gpu_memory_utilization" in model.model_fields_set:
        out.append(kv(f"{prefix}rollout.gpu_memory_utilization", model.gpu_memory_utilization))
    if model.max_model_len is not None:
        out.append(kv(f"{prefix}rollout.max_model_len", model.max_model_len))
    return out


# --- overrides ----------------------------------------------------------------------------------------------------


def policy_overrides(
    stage: PolicyOptimStage,
    *,
    model_path: str,
    train_files: Path,
    val_files: Path,
    external_modules: str,
    seed: int,
    lora_adapter_path: str | None,
) -> list[str]:
    """The algorithm, data, actor, rollout and LoRA overrides of a verl GRPO stage, whatever its reward."""
    max_response_length = stage.response_budget  # a reflection, or an agent's whole episode after its prompt
    if stage.rollouts < 2:
        raise ConfigError("GRPO needs at least 2 rollouts per prompt: a group of one has no relative advantage")
    mb = stage.micro_batch_size
    gpus = trainer_cluster(stage).gpus_per_node  # the node's GPUs that no served model keeps (train/placement.py)
    out: list[str] = [
        # verl's GRPO over the scored samples only (a failed judge or episode scores NaN):
        # memrl.train.verl.advantage, which verl imports in every process from VERL_USE_EXTERNAL_MODULES
        # (comma-separated).
        kv("algorithm.adv_estimator", ADV_ESTIMATOR),
        "+" + kv(f"{RUNTIME_ENV}.{MODULES_ENV}", verl_modules(external_modules)[MODULES_ENV]),
        kv("algorithm.use_kl_in_reward", False),
        # Dr. GRPO drops the std scaling of the group advantage along with the per-sequence length normalisation.
        kv("algorithm.norm_adv_by_std_in_grpo", stage.loss != "dr_grpo"),
        kv("data.train_files", str(train_files)),
        kv("data.val_files", str(val_files)),
        kv("data.train_batch_size", stage.batch_size),
        kv("data.max_prompt_length", stage.max_prompt_length),
        kv("data.max_response_length", max_response_length),
        # A prompt longer than the budget is dropped up front instead of failing the run mid-epoch.
        kv("data.filter_overlong_prompts", True),
        # verl's default (null) seeds the shuffling sampler from the clock: a resumed run would see another order.
        kv("data.seed", seed),
        # verl's V1 trainer (its default, run by TaskRunnerV1 over TransferQueue), named: the path memrl rehearses.
        kv("trainer.use_v1", True),
        kv("actor_rollout_ref.model.path", model_path),
        *_attention("actor_rollout_ref.model."),  # the actor and the reference load this model config
        kv("actor_rollout_ref.actor.optim.lr", stage.lr),
        # One optimizer step per training step: the mini-batch is the whole batch of prompts.
        kv("actor_rollout_ref.actor.ppo_mini_batch_size", stage.batch_size),
        kv("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", mb),
        # Micro batches packed by tokens (`policy_budget`); the rollout's and the reference's log-prob passes take
        # the same switch and budget through verl's own interpolation.
        kv("actor_rollout_ref.actor.use_dynamic_bsz", True),
        kv(ACTOR_TOKENS, policy_budget(stage).per_gpu),
        kv("actor_rollout_ref.actor.loss_agg_mode", LOSS_AGG_MODE[stage.loss]),
        kv("actor_rollout_ref.actor.entropy_coeff", 0),
        kv("actor_rollout_ref.actor.use_kl_loss", stage.kl_coef > 0),
    ]
    if stage.kl_coef > 0:
        out += [
            kv("actor_rollout_ref.actor.kl_loss_coef", stage.kl_coef),
            kv("actor_rollout_ref.actor.kl_loss_type", "low_var_kl"),
        ]
    if stage.loss == "dr_grpo":
        # A constant horizon: the sum over tokens is divided by the response budget, whatever the batch's padding.
        out.append(kv("actor_rollout_ref.actor.loss_scale_factor", max_response_length))
    out += [
        kv("actor_rollout_ref.rollout.name", "vllm"),
        kv("actor_rollout_ref.rollout.n", stage.rollouts),
        kv("actor_rollout_ref.rollout.temperature", stage.temperature),
        kv("actor_rollout_ref.rollout.tensor_model_parallel_size", rollout_tp(gpus)),
        kv("actor_rollout_ref.rollout.gpu_memory_utilization", stage.placement.rollout_memory_fraction),
        kv("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", mb),
        kv("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", mb),
    ]
    if stage.lora is not None:
        out += [
            *_lora("actor_rollout_ref.model.", stage.lora),
            # vLLM must load the real base weights (the adapter alone is synced each step), one layer at a time.
            kv("actor_rollout_ref.rollout.load_format", "safetensors"),
            kv("actor_rollout_ref.rollout.layered_summon", True),
        ]
        if lora_adapter_path is not None:
            out.append(kv("actor_rollout_ref.model.lora_adapter_path", lora_adapter_path))
    elif lora_adapter_path is not None:
        raise ConfigError("an SFT LoRA adapter can only start a GRPO stage that trains LoRA too (set stages.*.lora)")
    return out


class VerlRun(TypedDict, total=False):
    """Where a verl GRPO stage starts and writes, and how its run is named and logged (defaults: `stage_overrides`)."""

    model_path: Required[str]
    out_dir: Required[Path]
    experiment: Required[str]
    project: str
    logger: Logger
    lora_adapter_path: str | None
    resume: bool
    seed: int


def stage_overrides(
    stage: PolicyOptimStage,
    *,
    train_files: Path,
    val_files: Path,
    external_modules: str,
    task: Sequence[str],
    trainer: Sequence[str] = (),
    **run: Unpack[VerlRun],
) -> list[str]:
    """Hydra overrides for `python -m verl.trainer.main_ppo` (config `ppo_trainer`) of any GRPO stage: the policy's,
    then what the stage kind adds (`task`: its reward or agent loop; `trainer`: its own trainer.* keys), the run's
    length, checkpoints and loggers; `stage.overrides` come last."""
    out_dir, logger = run["out_dir"], run.get("logger", "console")
    out = policy_overrides(
        stage,
        model_path=run["model_path"],
        train_files=train_files,
        val_files=val_files,
        external_modules=external_modules,
        seed=run.get("seed", 0),
        lora_adapter_path=run.get("lora_adapter_path"),
    )
    out += [
        *task,
        kv("trainer.total_training_steps", stage.max_steps),
        # Every epoch has at least one step, so this many epochs never stops the run before max_steps.
        kv("trainer.total_epochs", stage.max_steps),
        *trainer,
        *_trainer_common(
            stage.checkpoints,
            PPO_KEEP,
            trainer_cluster(stage),
            out_dir,
            run["experiment"],
            run.get("project", "memrl"),
            logger,
            run.get("resume", True),
        ),
        # verl's loggers run in its Ray workers: the file logger's path (and wandb's folder) travel in their env.
        *(
            "+" + kv(f"{RUNTIME_ENV}.{name}", value)
            for name, value in tracking_env(out_dir, wandb=logger == "wandb").items()
        ),
    ]
    return out + list(stage.overrides)


def grpo_overrides(stage: GRPOStage, *, data_dir: Path, **run: Unpack[VerlRun]) -> list[str]:
    """The reflector's GRPO: the judge reward through verl's custom reward function (`stage_overrides`)."""
    reward: list[str] = []
    if hosts_judge(stage):
        assert isinstance(stage.reward.judge.model, VLLMModelConfig)
        reward += _hosted_judge(stage.reward.judge.model, trainer_cluster(stage))
    reward += [
        kv("reward.custom_reward_function.path", reward_path()),
        # set, not left to verl's default: the judge's max_concurrency is divided over exactly these workers
        kv("reward.num_workers", reward_workers(stage)),
        kv("reward.custom_reward_function.name", REWARD_FUNCTION),
        *("+" + kv(f"{REWARD_KWARGS}.{key}", value) for key, value in reward_kwargs(stage, data_dir).items()),
    ]
    return stage_overrides(
        stage,
        train_files=data_dir / "rl" / "train.parquet",
        val_files=data_dir / "rl" / "eval.parquet",
        external_modules=ADV_MODULE,
        task=reward,
        **run,
    )


def verl_modules(*modules: str) -> dict[str, str]:
    """The VERL_USE_EXTERNAL_MODULES of a verl job: memrl's compatibility patch, then `modules`."""
    return {MODULES_ENV: ",".join((COMPAT_MODULE, *modules))}


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
    seed: int = 0,
) -> list[str]:
    """Hydra overrides for verl's SFT trainer (config `sft_trainer_engine`); `stage.overrides` come last. Its loggers
    read their paths from the environment (`verl_metrics.tracking_env`), which the command's runner sets."""
    world = stage.cluster.nnodes * trainer_cluster(stage).gpus_per_node
    if stage.batch_size % world or (stage.batch_size // world) % stage.micro_batch_size:
        raise ConfigError(
            f"verl SFT: batch_size {stage.batch_size} must split evenly over {world} GPUs "
            f"and then into micro batches of {stage.micro_batch_size}"
        )
    if stage.max_steps is None and stage.epochs != int(stage.epochs):
        raise ConfigError(f"verl SFT counts whole epochs; epochs {stage.epochs} needs max_steps instead")
    out = [
        kv("data.train_files", str(data_dir / "sft" / "train.parquet")),
        kv("data.val_files", str(data_dir / "sft" / "eval.parquet")),
        kv("data.messages_key", "messages"),
        kv("data.train_batch_size", stage.batch_size),
        kv("data.micro_batch_size_per_gpu", stage.micro_batch_size),
        # Micro batches packed by tokens (`sft_budget`): short conversations share a micro-step.
        kv("data.use_dynamic_bsz", True),
        kv(SFT_TOKENS, sft_budget(stage).per_gpu),
        kv("data.max_length", stage.max_length),
        kv("data.truncation", "error"),
        kv("model.path", model_path),
        *_attention("model."),
    ]
    if stage.lora is not None:
        out += _lora("model.", stage.lora)
    if stage.lr_scheduler not in LR_SCHEDULERS:
        raise ConfigError(
            f"verl SFT schedules the learning rate {' or '.join(LR_SCHEDULERS)} after the warm-up; "
            f"lr_scheduler {stage.lr_scheduler!r} needs trainer trl or llamafactory"
        )
    out += [
        kv("optim.lr", stage.lr),
        kv("optim.lr_warmup_steps_ratio", stage.warmup_ratio),
        kv("optim.lr_scheduler_type", LR_SCHEDULERS[stage.lr_scheduler]),
        kv("trainer.total_epochs", math.ceil(stage.epochs)),
        # verl 0.9.1 records trainer.seed with the run; engine.seed seeds its full-determinism mode.
        kv("trainer.seed", seed),
        kv("engine.seed", seed),
    ]
    if stage.max_steps is not None:
        out.append(kv("trainer.total_training_steps", stage.max_steps))
    out += _trainer_common(
        stage.checkpoints, SFT_KEEP, trainer_cluster(stage), out_dir, experiment, project, logger, resume
    )
    return out + list(stage.overrides)


def _trainer_common(
    checkpoints: LoggingTarget,
    keep_keys: Sequence[str],
    cluster: ClusterConfig,
    out_dir: Path,
    experiment: str,
    project: str,
    logger: Logger,
    resume: bool,
) -> list[str]:
    return [
        kv("trainer.save_freq", checkpoints.save_steps),
        kv("trainer.test_freq", checkpoints.save_steps),
        kv("trainer.default_local_dir", str(out_dir / CHECKPOINT_SUBDIR)),
        # verl keeps every checkpoint unless told: ~90 GB per save of a 7B with its fp32 Adam state.
        *(kv(key, checkpoints.keep) for key in keep_keys),
        # auto: continue from the newest global_step_N under default_local_dir when there is one.
        kv("trainer.resume_mode", "auto" if resume else "disable"),
        kv("trainer.project_name", project),
        kv("trainer.experiment_name", experiment),
        kv("trainer.logger", _loggers(logger)),
        kv("trainer.nnodes", cluster.nnodes),
        kv("trainer.n_gpus_per_node", cluster.gpus_per_node),
    ]
