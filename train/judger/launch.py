"""Multi-GPU judger training: torchrun runs `memrl.app.judger_main` once per GPU; DeepSpeed ZeRO configs.

Several nodes: every node runs the same `memrl run` with NODE_RANK, MASTER_ADDR (and MASTER_PORT) set; the
printed command keeps those as `${NAME}` references for the same reason.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path

from memrl.core.envrefs import substitute
from memrl.core.errors import ConfigError
from memrl.train.config import ClusterConfig
from memrl.train.launch import format_command

__all__ = ["BUNDLED_DEEPSPEED", "deepspeed_config", "format_command", "resolve_refs", "torchrun_command"]

BUNDLED_DEEPSPEED = ("zero2", "zero3")


def deepspeed_config(ref: str, *, must_exist: bool = True) -> Path:
    """`zero2` / `zero3` name the configs memrl ships; anything else is a path to a DeepSpeed JSON.

    `must_exist` (a run, not a plan) also wants the JSON file and the deepspeed package, an optional extra.
    """
    if ref in BUNDLED_DEEPSPEED:
        path = Path(str(resources.files("memrl.recipes") / "deepspeed" / f"{ref}.json"))
    else:
        path = Path(ref).expanduser()
        if must_exist and not path.is_file():
            raise ConfigError(
                f"deepspeed: {ref!r} is neither {' nor '.join(BUNDLED_DEEPSPEED)} nor an existing JSON file"
            )
    if must_exist and importlib.util.find_spec("deepspeed") is None:
        raise ConfigError(f"deepspeed: {ref!r} needs the deepspeed package: pip install 'memrl[deepspeed]'")
    return path


def torchrun_command(entry: str, recipe: Path, stage: str, cluster: ClusterConfig) -> list[str]:
    """torchrun running module `entry` once per GPU on `recipe --stage stage`."""
    if cluster.ray_address is not None:
        raise ConfigError(f"stages.{stage}.cluster.ray_address: judger stages launch with torchrun, not Ray")
    local = Path(sys.executable).with_name("torchrun")
    argv = [str(local) if local.is_file() else "torchrun", f"--nnodes={cluster.nnodes}"]
    if cluster.nnodes == 1:
        argv.append("--standalone")
    else:
        argv += [
            "--node-rank=${NODE_RANK}",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=${MASTER_ADDR}:${MASTER_PORT:-29500}",
        ]
    return [*argv, f"--nproc-per-node={cluster.gpus_per_node}", "-m", entry, str(recipe), "--stage", stage]


def resolve_refs(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """Fill `${NAME}` / `${NAME:-default}` from the environment; an unset name without default fails in one line.
    (`format_command`, from memrl.train.launch, prints the command with the references left for the shell.)"""
    return [substitute(arg, environ, message=_unset) for arg in argv]


def _unset(name: str) -> str:
    return f"multi-node judger training: set {name} on every node (NODE_RANK, MASTER_ADDR)"
