"""Checking verl overrides on CPU against verl's own Hydra config, so that a typo or a wrong type fails in one line
here instead of on the GPU job: unknown keys, bad syntax, wrong types, and verl's own consistency checks.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memrl.core.errors import ConfigError, closest, first_line

if TYPE_CHECKING:
    from omegaconf import DictConfig

PPO_CONFIG = "ppo_trainer"
SFT_CONFIG = "sft_trainer_engine"
VLLM_MAX_LORA_RANK = 512  # the largest rank vLLM serves (verl's fallback list when vLLM is not installed)


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
    if cfg.reward.reward_model.enable:  # a judge verl hosts: its vLLM settings, checked as verl will read them
        omega_conf_to_dataclass(cfg.reward.reward_model)
    rank = int(cfg.actor_rollout_ref.model.get("lora_rank", 0) or 0)
    if rank > 0 and importlib.util.find_spec("vllm") is None:
        # verl asks vLLM for its largest LoRA rank and cannot import it on a CPU machine: check it here instead.
        if rank > VLLM_MAX_LORA_RANK:
            raise ConfigError(f"verl ppo_trainer: lora_rank {rank} exceeds vLLM's maximum of {VLLM_MAX_LORA_RANK}")
        cfg.actor_rollout_ref.model.lora_rank = 0
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    _batch_checks(cfg)


def _batch_checks(cfg: DictConfig) -> None:
    """The batch checks verl 0.9.1 runs only for fixed micro batches (`validate_config`, `ActorConfig.validate`):
    micro batches packed by tokens need the same whole mini batches and an even split over the GPUs."""
    actor, data = cfg.actor_rollout_ref.actor, cfg.data
    if not actor.use_dynamic_bsz:
        return
    if data.train_batch_size < actor.ppo_mini_batch_size:
        raise ConfigError(
            f"verl ppo_trainer: train_batch_size ({data.train_batch_size}) must be >= actor.ppo_mini_batch_size "
            f"({actor.ppo_mini_batch_size})"
        )
    samples, gpus = data.train_batch_size * cfg.actor_rollout_ref.rollout.n, cfg.trainer.n_gpus_per_node
    if samples % (gpus * cfg.trainer.nnodes):
        raise ConfigError(
            f"verl ppo_trainer: an update's {samples} samples (train_batch_size x rollout.n) must split evenly over "
            f"the {gpus * cfg.trainer.nnodes} training GPUs"
        )
