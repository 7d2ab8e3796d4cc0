"""verl on GPU clusters: a stage becomes Hydra overrides, checked against verl's own config on CPU, then a command.

GRPO runs `verl.trainer.main_ppo`; SFT runs `verl.trainer.sft_trainer` under torchrun on one node, or
`verl.trainer.sft_trainer_ray` on a Ray cluster. With `cluster.ray_address` set the job goes through
`ray job submit`; memrl and verl must then be installed on every node, and the data, model and output paths must
be visible there. Secrets never enter the command: the Ray runtime environment names WANDB_*, HF_* and
MEMRL_JUDGE_API_KEY variables as `${NAME}` references, filled in from the environment when the job is submitted.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import math
import os
import re
import shlex
import sys
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from memrl.core.errors import ConfigError, closest, first_line
from memrl.train.config import ClusterConfig, GRPOStage, LoraConfig, SFTStage
from memrl.train.launch import run_logged

if TYPE_CHECKING:
    from omegaconf import DictConfig

Logger = Literal["wandb", "console"]

PPO_CONFIG = "ppo_trainer"
SFT_CONFIG = "sft_trainer_engine"
PPO_ENTRY = "verl.trainer.main_ppo"
SFT_ENTRY = "verl.trainer.sft_trainer"
SFT_RAY_ENTRY = "verl.trainer.sft_trainer_ray"

REWARD_MODULE = "memrl.rewards.verl_reward"
# The async variant: verl's reward loop awaits it, and concurrent samples share one judge batch.
REWARD_FUNCTION = "compute_score_async"
REWARD_KWARGS = "reward.custom_reward_function.reward_kwargs"

# How each recipe loss aggregates token losses in verl (names from verl.trainer.ppo.core_algos.agg_loss).
LOSS_AGG_MODE = {"grpo": "seq-mean-token-mean", "dapo": "token-mean", "dr_grpo": "seq-mean-token-sum-norm"}
VLLM_MAX_LORA_RANK = 512  # the largest rank vLLM serves (verl's fallback list when vLLM is not installed)
JUDGE_KEY_ENV = "MEMRL_JUDGE_API_KEY"
ENV_PASSTHROUGH = ("WANDB_", "HF_", JUDGE_KEY_ENV)
CHECKPOINT_SUBDIR = "checkpoints"

_PLAIN = re.compile(r"^[A-Za-z0-9_./:~+@-]+$")
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


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


def _lora_targets(lora: LoraConfig) -> str | list[str]:
    return lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules)


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
    full JudgeConfig mapping, the weights and the length penalty. Never a secret: the judge's API key is left out
    (it would land in the command and verl's logs); `secret_env` hands it to the job as MEMRL_JUDGE_API_KEY."""
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


def secret_env(stage: GRPOStage) -> dict[str, str]:
    """Environment entries the job needs and the command must not show: the LLM judge's API key."""
    model = stage.reward.judge.model
    key = getattr(model, "api_key", None)
    return {JUDGE_KEY_ENV: key.get_secret_value()} if key is not None else {}


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
            _kv("actor_rollout_ref.model.lora_rank", stage.lora.rank),
            _kv("actor_rollout_ref.model.lora_alpha", stage.lora.alpha),
            _kv("actor_rollout_ref.model.target_modules", _lora_targets(stage.lora)),
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
        out += [
            _kv("model.lora_rank", stage.lora.rank),
            _kv("model.lora_alpha", stage.lora.alpha),
            _kv("model.target_modules", _lora_targets(stage.lora)),
        ]
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


# --- validation against verl's own config -------------------------------------------------------------------------


def config_dir() -> Path:
    """verl's Hydra config folder, found without importing verl (its import pulls in torch and more)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("verl is not installed: pip install 'memrl[verl]'")
    return Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"


def compose(config_name: str, overrides: Sequence[str]) -> DictConfig:
    """verl's config `config_name` with the overrides applied, as verl's `@hydra.main` would build it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    _check_keys(config_name, overrides)
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base=None):
            return hydra_compose(config_name=config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(f"verl {config_name}: {first_line(exc)}") from None


@lru_cache(maxsize=4)
def _defaults(config_name: str) -> tuple[DictConfig, frozenset[str]]:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(config_dir()), version_base=None):
        cfg = hydra_compose(config_name=config_name)
    return cfg, frozenset(_flat_keys(cfg))


def _flat_keys(node: Any, prefix: str = "") -> Iterable[str]:
    from omegaconf import DictConfig

    if not isinstance(node, DictConfig):
        return
    for key in node:
        path = f"{prefix}{key!s}"
        yield path
        yield from _flat_keys(node._get_node(key), path + ".")


def _override_key(item: str) -> str | None:
    """The dotted key an override sets, or None for appends/deletes and defaults-list choices Hydra checks itself."""
    key, sep, _ = item.partition("=")
    if not sep:
        raise ConfigError(f"verl override {item!r} is not key=value")
    if key.startswith(("+", "~")) or "@" in key or "/" in key or key.startswith("hydra."):
        return None
    return key


def _check_keys(config_name: str, overrides: Sequence[str]) -> None:
    _, known = _defaults(config_name)
    for item in overrides:
        key = _override_key(item)
        if key is not None and key not in known:
            match = closest(key, known, cutoff=0.8)
            hint = f" (did you mean {match!r}?)" if match else ""
            raise ConfigError(f"verl {config_name} has no key {key!r}{hint}")


def _check_types(config_name: str, cfg: DictConfig, overrides: Sequence[str]) -> None:
    """A number must stay a number and a flag a flag: Hydra itself accepts `lr=abc` and fails on the GPU later."""
    defaults, _ = _defaults(config_name)
    for item in overrides:
        key = _override_key(item)
        if key is None:
            continue
        old, new = _leaf(defaults, key), _leaf(cfg, key)
        if old is None or new is None:
            continue
        if isinstance(old, bool) and not isinstance(new, bool):
            raise ConfigError(f"verl {config_name}: {key} must be true or false, got {new!r}")
        if _numeric(old) and not _numeric(new):
            raise ConfigError(f"verl {config_name}: {key} must be a number, got {new!r}")


def _leaf(cfg: DictConfig, key: str) -> Any:
    """The plain value at `key`; None for nulls, sections, and interpolations (checked when verl resolves them)."""
    from omegaconf import OmegaConf

    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    if not OmegaConf.is_dict(node) or leaf not in node:
        return None
    child = node._get_node(leaf)
    if child is None or OmegaConf.is_config(child) or child._is_interpolation():
        return None
    return child._value()


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def validate_overrides(config_name: str, overrides: Sequence[str], *, deep: bool = True) -> None:
    """Fail on CPU, in one line, where verl would fail on the GPU job: unknown keys, bad syntax, wrong types, and
    (deep) verl's own consistency checks of a PPO config (batch divisibility, micro batches, loss mode, LoRA rank)."""
    cfg = compose(config_name, overrides)
    _check_types(config_name, cfg, overrides)
    if deep:
        _verl_checks(config_name, cfg)


def _verl_checks(config_name: str, cfg: DictConfig) -> None:
    import warnings

    from omegaconf import DictConfig, OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    copy = OmegaConf.create(OmegaConf.to_container(cfg))  # the checks below may edit it
    assert isinstance(copy, DictConfig)
    try:
        # verl prints a success line and warns about the critic it leaves out; neither helps here.
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            if config_name == PPO_CONFIG:
                _ppo_checks(copy)
            else:
                for section in ("engine", "optim", "checkpoint"):
                    omega_conf_to_dataclass(copy[section])
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"verl {config_name}: {_reason(exc)}") from None


def _reason(exc: BaseException) -> str:
    """The line that says what is wrong: Hydra wraps a dataclass's own error under a generic first line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].startswith("Error in call to target"):
        return lines[1]
    return first_line(exc)


def _ppo_checks(cfg: DictConfig) -> None:
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    omega_conf_to_dataclass(cfg.algorithm)
    omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    rank = int(cfg.actor_rollout_ref.model.get("lora_rank", 0) or 0)
    if rank > 0 and importlib.util.find_spec("vllm") is None:
        # verl asks vLLM for its largest LoRA rank and cannot import it on a CPU machine: check it here instead.
        if rank > VLLM_MAX_LORA_RANK:
            raise ConfigError(f"verl ppo_trainer: lora_rank {rank} exceeds vLLM's maximum of {VLLM_MAX_LORA_RANK}")
        cfg.actor_rollout_ref.model.lora_rank = 0
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))


# --- the command --------------------------------------------------------------------------------------------------


def verl_command(
    kind: Literal["grpo", "sft"],
    overrides: Sequence[str],
    cluster: ClusterConfig,
    *,
    python: str | None = None,
    working_dir: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[str]:
    """The argv that runs a verl stage: local (`python -m ...`, torchrun for SFT) or `ray job submit` to a cluster.

    `python` is this interpreter locally; on a cluster it is the nodes' `python`. `working_dir` (cluster only) is
    uploaded by Ray and becomes the job's working directory.
    """
    environ = os.environ if environ is None else environ
    if cluster.ray_address is None:
        python = python or sys.executable
        if kind == "grpo":
            # main_ppo starts Ray itself, or joins the cluster this node belongs to (multi-node: run on the head).
            return [python, "-m", PPO_ENTRY, *overrides]
        if cluster.nnodes > 1:
            raise ConfigError("verl SFT on several nodes runs through Ray: set cluster.ray_address")
        return [
            python,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nnodes=1",
            f"--nproc_per_node={cluster.gpus_per_node}",
            "-m",
            SFT_ENTRY,
            *overrides,
        ]
    entry = PPO_ENTRY if kind == "grpo" else SFT_RAY_ENTRY
    runtime_env: dict[str, Any] = {}
    if working_dir is not None:
        runtime_env["working_dir"] = str(working_dir)
    names = sorted(n for n in environ if n.startswith(ENV_PASSTHROUGH))
    if names:
        runtime_env["env_vars"] = {n: "${" + n + "}" for n in names}
    return [
        "ray",
        "job",
        "submit",
        "--address",
        cluster.ray_address,
        "--runtime-env-json",
        json.dumps(runtime_env, sort_keys=True),
        "--",
        python or "python",
        "-m",
        entry,
        *overrides,
    ]


def resolve_env_refs(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """Fill the `${NAME}` references of the Ray runtime environment from the environment (in memory only)."""
    environ = os.environ if environ is None else environ
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if arg == "--runtime-env-json":
            out[i + 1] = _ENV_REF.sub(lambda m: json.dumps(environ.get(m.group(1), ""))[1:-1], out[i + 1])
    return out


def format_command(argv: Sequence[str], *, multiline: bool = True) -> str:
    """The command as a shell would take it (for --dry-run). `${NAME}` references in the Ray runtime environment
    stay live, so pasting the line into a shell sends that shell's values, never ones written here."""
    parts: list[str] = []
    for i, arg in enumerate(argv):
        after_env_flag = i > 0 and argv[i - 1] == "--runtime-env-json"
        parts.append(_double_quote_keeping_refs(arg) if after_env_flag else shlex.quote(arg))
    if not multiline:
        return " ".join(parts)
    # The launcher up to the entry module on the first line, then one argument per continuation line.
    modules = [i for i, arg in enumerate(argv[:-1]) if arg == "-m"]
    split = modules[-1] + 2 if modules else len(argv)
    return " \\\n    ".join([" ".join(parts[:split]), *parts[split:]])


def _double_quote_keeping_refs(text: str) -> str:
    pieces = []
    last = 0
    for match in _ENV_REF.finditer(text):
        pieces.append(_escape_double(text[last : match.start()]))
        pieces.append(match.group(0))
        last = match.end()
    pieces.append(_escape_double(text[last:]))
    return '"' + "".join(pieces) + '"'


def _escape_double(text: str) -> str:
    return re.sub(r'([\\"$`])', r"\\\1", text)


def run_verl(argv: Sequence[str], log_path: Path, *, env: Mapping[str, str] | None = None, tail: int = 20) -> int:
    """Run the command, copying its output to `log_path` and the console; a failure raises with the last lines."""
    full_env = dict(os.environ if env is None else env)
    # The logged command keeps the `${NAME}` references; only the child process sees their values.
    shown = format_command(argv, multiline=False)
    run_logged(resolve_env_refs(argv, full_env), log_path, name="verl", shown=shown, env=full_env, tail=tail)
    return 0
