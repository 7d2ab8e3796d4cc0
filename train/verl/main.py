"""memrl's entry to verl's PPO trainer: `python -m memrl.train.verl.main <verl Hydra overrides>`.

verl's `main_ppo` starts Ray (or joins a cluster with `ray_kwargs.ray_init.address=auto`) with only its own
runtime_env; a worker on a running cluster sees nothing of this process's environment, so `WANDB_MODE` and the API
keys memrl hands over by variable (MEMRL_JUDGE_API_KEY, MEMRL_USER_API_KEY, MEMRL_OUTCOME_*) would never arrive.
This entry composes verl's config exactly as verl does (the same Hydra config, the same overrides), starts Ray
itself with one runtime_env: the Ray job's own variables (when it runs as a job), the variables `forwarded_env`
picks from this environment, verl's defaults and the config's `ray_kwargs.ray_init.runtime_env`, in that order;
then it hands over to verl's own `main` (which finds Ray started and leaves it). The values travel only in memory:
verl prints its config and its own ray.init arguments, so no secret may go in either.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from typing import Any

from memrl.core import interrupts
from memrl.envs.ray_start import local_ray

FORWARD_PREFIXES = ("WANDB_", "HF_", "VERL_FILE_LOGGER_", "MEMRL_")
RAY_JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray's job supervisor for a job's entrypoint
RAY_OVERRIDE_ENV = "RAY_OVERRIDE_JOB_RUNTIME_ENV"


def forwarded_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What of this process's environment every Ray worker of the run gets: wandb's, Hugging Face's and verl's file
    logger's settings, and memrl's (API keys by variable, MEMRL_UNSCORED, the cache)."""
    return {name: environ[name] for name in sorted(environ) if name.startswith(FORWARD_PREFIXES)}


def job_env_vars(environ: Mapping[str, str]) -> dict[str, str]:
    """The env_vars of the Ray job this process runs in (none outside a job)."""
    raw = environ.get(RAY_JOB_CONFIG_ENV)
    if not raw:
        return {}
    runtime_env = json.loads(raw).get("runtime_env") or {}
    return {str(k): str(v) for k, v in (runtime_env.get("env_vars") or {}).items()}


def runtime_env(
    verl_default: Mapping[str, Any], configured: Mapping[str, Any], environ: Mapping[str, str]
) -> dict[str, Any]:
    """The one runtime_env of the run: verl's defaults with the config's on top (as verl merges them), whose
    env_vars are, later winning: the job's, the forwarded ones, verl's defaults, the config's."""
    env_vars = (
        job_env_vars(environ)
        | forwarded_env(environ)
        | dict(verl_default.get("env_vars") or {})
        | dict(configured.get("env_vars") or {})
    )
    out = {k: v for k, v in verl_default.items() if k != "env_vars"}
    out |= {k: v for k, v in configured.items() if k != "env_vars"}
    return out | {"env_vars": {k: str(v) for k, v in env_vars.items()}}


def _verl_flags(config: Any) -> None:
    """What verl 0.9.1's run_ppo puts in the environment before it builds its runtime_env (main_ppo.py:43-54)."""
    rollout, rm = config.actor_rollout_ref.rollout, config.reward.reward_model
    if rollout.full_determinism or (rm.enable and rm.rollout.full_determinism):
        os.environ["VERL_FULL_DETERMINISM"] = "1"
        os.environ["VLLM_BATCH_INVARIANT"] = "1"
        os.environ["PYTHONHASHSEED"] = str(rollout.seed)
    loggers = config.trainer.get("logger", [])
    if "rl_insight" in ([loggers] if isinstance(loggers, str) else loggers or []):
        os.environ["VERL_RL_INSIGHT_ENABLE"] = "1"


def ray_init_kwargs(config: Any, environ: Mapping[str, str]) -> dict[str, Any]:
    """ray.init's arguments for the composed verl config: verl's own (run_ppo), with the whole runtime_env."""
    from omegaconf import OmegaConf
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    init = OmegaConf.to_container(config.ray_kwargs.get("ray_init", {}), resolve=True)
    assert isinstance(init, dict)
    configured = init.pop("runtime_env", None) or {}
    default = get_ppo_ray_runtime_env(config)
    # verl's choice for `environ` (it reads os.environ): no working dir upload, except inside a job, whose own
    # working dir a None here would replace.
    default.pop("working_dir", None)
    if RAY_JOB_CONFIG_ENV not in environ:
        default["working_dir"] = None
    if config.transfer_queue.enable:
        default.setdefault("env_vars", {})["TRANSFER_QUEUE_ENABLE"] = "1"
    return {str(k): v for k, v in init.items()} | {"runtime_env": runtime_env(default, configured, environ)}


def init_ray(config: Any) -> None:
    """Start or join Ray for the run, every variable the workers need in its runtime_env (names logged, no value)."""
    import ray

    if ray.is_initialized():
        return
    _verl_flags(config)
    kwargs = ray_init_kwargs(config, os.environ)
    # The job's variables are already in `kwargs`: Ray may take this runtime_env over the job's where both set a
    # variable (WANDB_DIR, say) instead of refusing to start.
    os.environ[RAY_OVERRIDE_ENV] = "1"
    names = ", ".join(sorted(kwargs["runtime_env"]["env_vars"]))
    print(f"memrl: ray.init(address={kwargs.get('address')!r}), worker environment: {names}", flush=True)
    local = kwargs.get("address") in (None, "local") and not os.environ.get("RAY_ADDRESS")
    # A Ray of this run's own: loopback only, with a token of this process's (envs/ray_start.py, as memrl's drivers)
    setup: contextlib.AbstractContextManager[dict[str, Any]] = local_ray() if local else contextlib.nullcontext({})
    with interrupts.kept(), setup as options:
        ray.init(**(kwargs | options | ({"address": "local"} if local else {})))


def _main() -> None:
    import hydra
    from verl.trainer import main_ppo

    @hydra.main(config_path="pkg://verl.trainer.config", config_name="ppo_trainer", version_base=None)
    def main(config: Any) -> None:
        init_ray(config)
        main_ppo.main.__wrapped__(config)  # verl's own main body (checks, V1 or legacy runner), Hydra unwrapped

    main()


if __name__ == "__main__":
    _main()
