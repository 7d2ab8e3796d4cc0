"""Running verl: the argv (local, torchrun for SFT, or `ray job submit`), the secrets it passes by environment
reference only, and the run itself with its output logged.

GRPO runs `verl.trainer.main_ppo`; SFT runs `verl.trainer.sft_trainer` under torchrun on one node, or
`verl.trainer.sft_trainer_ray` on a Ray cluster. With `cluster.ray_address` set the job goes through
`ray job submit`; memrl and verl must then be installed on every node, and the data, model and output paths must
be visible there. Secrets never enter the command: the Ray runtime environment names WANDB_*, HF_* and
MEMRL_JUDGE_API_KEY variables as `${NAME}` references, filled in from the environment when the job is submitted.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from memrl.core.envrefs import substitute
from memrl.core.errors import ConfigError
from memrl.train import launch
from memrl.train.config import ClusterConfig, GRPOStage

PPO_ENTRY = "verl.trainer.main_ppo"
SFT_ENTRY = "verl.trainer.sft_trainer"
SFT_RAY_ENTRY = "verl.trainer.sft_trainer_ray"
JUDGE_KEY_ENV = "MEMRL_JUDGE_API_KEY"
ENV_PASSTHROUGH = ("WANDB_", "HF_", JUDGE_KEY_ENV)
RUNTIME_ENV_FLAG = "--runtime-env-json"


def secret_env(stage: GRPOStage) -> dict[str, str]:
    """Environment entries the job needs and the command must not show: the LLM judge's API key."""
    model = stage.reward.judge.model
    key = getattr(model, "api_key", None)
    return {JUDGE_KEY_ENV: key.get_secret_value()} if key is not None else {}


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
        RUNTIME_ENV_FLAG,
        json.dumps(runtime_env, sort_keys=True),
        "--",
        python or "python",
        "-m",
        entry,
        *overrides,
    ]


def resolve_env_refs(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """Fill the `${NAME}` references of the Ray runtime environment from the environment (in memory only); an unset
    name becomes empty."""
    out = list(argv)
    for i in _runtime_env_args(argv):
        out[i] = substitute(out[i], environ, fallback="", escape=lambda value: json.dumps(value)[1:-1])
    return out


def format_command(argv: Sequence[str], *, multiline: bool = True) -> str:
    """The command as a shell would take it (for --dry-run). `${NAME}` references in the Ray runtime environment
    stay live, so pasting the line into a shell sends that shell's values, never ones written here."""
    return launch.format_command(argv, multiline=multiline, live=_runtime_env_args(argv))


def _runtime_env_args(argv: Sequence[str]) -> set[int]:
    return {i + 1 for i, arg in enumerate(argv[:-1]) if arg == RUNTIME_ENV_FLAG}


def run_verl(argv: Sequence[str], log_path: Path, *, env: Mapping[str, str] | None = None, tail: int = 20) -> int:
    """Run the command, copying its output to `log_path` and the console; a failure raises with the last lines."""
    full_env = dict(os.environ if env is None else env)
    # The logged command keeps the `${NAME}` references; only the child process sees their values.
    shown = format_command(argv, multiline=False)
    launch.run_logged(resolve_env_refs(argv, full_env), log_path, name="verl", shown=shown, env=full_env, tail=tail)
    return 0
