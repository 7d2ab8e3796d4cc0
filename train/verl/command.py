"""Running verl: the argv (local, torchrun for SFT, or `ray job submit`), the secrets it passes by environment
reference only, and the run itself with its output logged.

GRPO runs `memrl.train.verl.main` (verl's `main_ppo` with one Ray runtime_env that carries the job's variables to every
worker, `main` says why); SFT runs `verl.trainer.sft_trainer` under torchrun on one node, or
`verl.trainer.sft_trainer_ray` on a Ray cluster. With `cluster.ray_address` set the stage is a Ray job; memrl and
verl must then be installed on every node, and the data, model and output paths must be visible there. Its argv is
the `ray job submit` a shell would run (for --dry-run and the log), whose runtime environment names WANDB_*, HF_*,
VERL_FILE_LOGGER_* and MEMRL_* (the API-key variables among them) as `${NAME}` references; `run_verl` submits
that job through Ray's Python client instead of running the `ray` CLI, filling the references in memory, so no
secret is ever on a command line.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from memrl.core.envrefs import substitute
from memrl.core.errors import ConfigError
from memrl.core.secrets import redact
from memrl.rewards.config import UnscoredStop
from memrl.rewards.unscored import unscored_env
from memrl.train import processes, ray_jobs
from memrl.train.config import ClusterConfig, GRPOStage
from memrl.train.endpoints import Endpoint, is_local, stage_endpoints
from memrl.train.verl.main import FORWARD_PREFIXES
from memrl.train.verl.overrides import MODULES_ENV
from memrl.train.verl.rewards import JUDGE_KEY_ENV, OUTCOME_KEY_ENVS

PPO_ENTRY = "memrl.train.verl.main"
SFT_ENTRY = "verl.trainer.sft_trainer"
SFT_RAY_ENTRY = "verl.trainer.sft_trainer_ray"
# What a `ray job submit` passes by reference: what `main` forwards to the workers (the API keys are MEMRL_*).
ENV_PASSTHROUGH = (*FORWARD_PREFIXES, MODULES_ENV)
RUNTIME_ENV_FLAG = "--runtime-env-json"
RAY_SUBMIT = ["ray", "job", "submit"]


def refuse_local_endpoints(endpoints: list[Endpoint], cluster: ClusterConfig) -> None:
    """On several nodes, 127.0.0.1 is another host on each node: a worker elsewhere would call a server not there."""
    if cluster.nnodes <= 1:
        return
    for endpoint in endpoints:
        if is_local(endpoint.model.endpoint):
            raise ConfigError(
                f"{endpoint.label}: a local address on a {cluster.nnodes}-node stage means a different host on each "
                "node; give an address every node reaches"
            )


def unscored_job_env(stop: UnscoredStop, endpoints: list[Endpoint]) -> dict[str, str]:
    """MEMRL_UNSCORED for the job: the stop's limits and what to name when it fires (URL and model, no key)."""
    return unscored_env(stop, [redact(e.label) for e in endpoints])


def job_env(stage: GRPOStage) -> dict[str, str]:
    """What a GRPO job's environment adds for memrl: the API keys (`secret_env`) and the unscored stop."""
    return secret_env(stage) | unscored_job_env(stage.unscored, stage_endpoints(stage))


def secret_env(stage: GRPOStage) -> dict[str, str]:
    """Environment entries the job needs and the command must not show: the API keys of the LLM judge and of the
    outcome reward's agent and judge."""
    models = [(JUDGE_KEY_ENV, stage.reward.judge.model)]
    if stage.reward.outcome is not None:
        models += [(env, getattr(stage.reward.outcome, role)) for role, env in OUTCOME_KEY_ENVS.items()]
    keys = {env: getattr(model, "api_key", None) for env, model in models}
    return {env: key.get_secret_value() for env, key in keys.items() if key is not None}


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
            # `main` starts Ray, or joins the cluster this node belongs to (multi-node: run on the head).
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
        *RAY_SUBMIT,
        "--address",
        cluster.ray_address,
        RUNTIME_ENV_FLAG,
        json.dumps(runtime_env, sort_keys=True),
        "--",
        python or "python",
        "-m",
        entry,
        *overrides,
    ]


@dataclass(frozen=True)
class RaySubmission:
    """A `ray job submit` argv read back: where it goes, what it runs, and its runtime environment with the
    `${NAME}` references filled in (in memory only; an unset name becomes empty)."""

    address: str
    entrypoint: list[str]
    runtime_env: dict[str, Any]

    @classmethod
    def parse(cls, argv: Sequence[str], environ: Mapping[str, str]) -> RaySubmission | None:
        """None for an argv that is not `ray job submit ... -- ENTRYPOINT`."""
        if list(argv[:3]) != RAY_SUBMIT or "--" not in argv:
            return None
        split = list(argv).index("--")
        options = dict(zip(argv[3:split:2], argv[4:split:2], strict=False))
        runtime_env = json.loads(options.get(RUNTIME_ENV_FLAG, "{}"))
        if "env_vars" in runtime_env:
            env_vars = runtime_env["env_vars"]
            runtime_env["env_vars"] = {k: substitute(v, environ, fallback="") for k, v in env_vars.items()}
        return cls(options["--address"], list(argv[split + 1 :]), runtime_env)


def format_command(argv: Sequence[str], *, multiline: bool = True) -> str:
    """The command as a shell would take it (for --dry-run). `${NAME}` references in the Ray runtime environment
    stay live, so pasting the line into a shell sends that shell's values, never ones written here."""
    return processes.format_command(argv, multiline=multiline, live=_runtime_env_args(argv))


def _runtime_env_args(argv: Sequence[str]) -> set[int]:
    return {i + 1 for i, arg in enumerate(argv[:-1]) if arg == RUNTIME_ENV_FLAG}


def run_verl(argv: Sequence[str], log_path: Path, *, env: Mapping[str, str] | None = None, tail: int = 20) -> int:
    """Run the command (a `ray job submit` argv: submit the job in-process), copying its output to `log_path` and
    the console; a failure raises with the last lines."""
    full_env = dict(os.environ if env is None else env)
    # The logged command keeps the `${NAME}` references; only the child process or the Ray job sees their values.
    shown = format_command(argv, multiline=False)
    job = RaySubmission.parse(argv, full_env)
    if job is None:
        processes.run_logged(argv, log_path, name="verl", shown=shown, env=full_env, tail=tail)
    else:
        ray_jobs.run_job_logged(
            job.address, job.entrypoint, job.runtime_env, log_path, name="verl", shown=shown, tail=tail
        )
    return 0
