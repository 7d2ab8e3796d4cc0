"""Running one recipe stage as several processes: the launcher command (torchrun, `accelerate launch`), how many
processes a TRL stage takes, and the environment that pins a one-GPU stage to its device.

The launched module runs `RECIPE --stage NAME` in each process. Several nodes: every node runs the same `memrl run`
with NODE_RANK and MASTER_ADDR (and MASTER_PORT) set; the printed command keeps those as `${NAME}` references, filled
from each node's own environment (`resolve_refs`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from memrl.core.envrefs import substitute
from memrl.core.errors import ConfigError
from memrl.train.config import ClusterConfig

# Set by torchrun and `accelerate launch` in every process they start: such a process is one of their ranks.
WORLD_SIZE_VAR = "WORLD_SIZE"
LOOPBACK_ENTRY = "memrl.train.loopback"
MULTI_NODE_REFS = ("${NODE_RANK}", "${MASTER_ADDR}", "${MASTER_PORT:-29500}")


def is_rank(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process is one rank of a distributed launcher (it then trains in-process)."""
    return WORLD_SIZE_VAR in (os.environ if environ is None else environ)


def rank(environ: Mapping[str, str] | None = None) -> int:
    """This process's global rank under the launcher (`RANK`), else 0."""
    return int((os.environ if environ is None else environ).get("RANK", "0"))


def world_size(environ: Mapping[str, str] | None = None) -> int:
    """Processes training together: the launcher's world size, else 1."""
    return int((os.environ if environ is None else environ).get(WORLD_SIZE_VAR, "1"))


def visible_gpus() -> list[str]:
    """The CUDA devices this process sees, named as CUDA_VISIBLE_DEVICES names them (indexes when it is unset)."""
    import torch

    count = torch.cuda.device_count()  # reads NVML, honours CUDA_VISIBLE_DEVICES, does not initialise CUDA
    named = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return named[:count] if len(named) >= count else [str(i) for i in range(count)]


def _tool(name: str) -> str:
    """A console script of this interpreter's environment, else whatever PATH finds."""
    local = Path(sys.executable).with_name(name)
    return str(local) if local.is_file() else name


def _entry(entry: str, recipe: Path, stage: str) -> list[str]:
    return ["-m", entry, str(recipe), "--stage", stage]


# On one node, the launcher's stores listen on 127.0.0.1 (`loopback`) and the ranks talk over the loopback
# interface (gloo's and NCCL's own sockets); a variable the user set wins.
ONE_NODE_ENV = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}


def _launcher(name: str, nnodes: int) -> list[str]:
    """The launcher's command: on one node through `loopback` (stores on 127.0.0.1 only), on several as installed."""
    return [sys.executable, "-m", LOOPBACK_ENTRY, name] if nnodes == 1 else [_tool(name)]


def ranks_env(cluster: ClusterConfig, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What the launcher's ranks get in their environment: on one node, the loopback interface for their traffic."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in ONE_NODE_ENV.items() if k not in env} if cluster.nnodes == 1 else {}


def torchrun_command(entry: str, recipe: Path, stage: str, cluster: ClusterConfig) -> list[str]:
    """torchrun running module `entry` once per GPU of the cluster on `recipe --stage stage`."""
    if cluster.ray_address is not None:
        raise ConfigError(f"stages.{stage}.cluster.ray_address: this stage launches with torchrun, not Ray")
    argv = [*_launcher("torchrun", cluster.nnodes), f"--nnodes={cluster.nnodes}"]
    if cluster.nnodes == 1:
        argv.append("--standalone")
    else:
        rank, addr, port = MULTI_NODE_REFS
        argv += [f"--node-rank={rank}", "--rdzv-backend=c10d", f"--rdzv-endpoint={addr}:{port}"]
    return [*argv, f"--nproc-per-node={cluster.gpus_per_node}", *_entry(entry, recipe, stage)]


def accelerate_command(entry: str, recipe: Path, stage: str, cluster: ClusterConfig, per_node: int) -> list[str]:
    """`accelerate launch`, TRL's own launcher, running module `entry` in `per_node` processes on each node."""
    argv = [
        *_launcher("accelerate", cluster.nnodes),
        "launch",
        "--multi_gpu",
        f"--num_processes={per_node * cluster.nnodes}",  # accelerate counts processes over all nodes
        f"--num_machines={cluster.nnodes}",
        "--mixed_precision=no",  # the trainer's own config picks bf16; said here only to keep accelerate quiet
        "--dynamo_backend=no",
    ]
    if cluster.nnodes > 1:
        rank, addr, port = MULTI_NODE_REFS
        argv += [f"--machine_rank={rank}", f"--main_process_ip={addr}", f"--main_process_port={port}"]
    return [*argv, *_entry(entry, recipe, stage)]


@dataclass(frozen=True)
class Spawn:
    """How a stage leaves this process: the command and what it adds to the environment."""

    argv: list[str]
    env: dict[str, str]
    launcher: str  # named in logs and errors


def trl_spawn(
    entry: str,
    recipe: Path,
    stage: str,
    cluster: ClusterConfig,
    visible: Sequence[str],
    *,
    inside: bool = False,
    trainer_gpus: Sequence[int] | None = None,
) -> Spawn | None:
    """How a TRL stage runs given the GPUs this process sees; None: in this process.

    TRL 1.16's trainers refuse one process that sees several GPUs (`args.n_gpu > 1`: `nn.DataParallel`). So with
    several visible GPUs the stage never runs here: one GPU per process, `cluster.gpus_per_node` of them (at most
    what is visible) under `accelerate launch`, or a single process pinned to the first GPU. `trainer_gpus`: the
    node's GPUs (indexes into `visible`) the placement plan leaves the trainer; the others hold served models.
    `inside`: this process already is one rank. CPU or one visible GPU: in this process, as before.
    """
    if inside or len(visible) <= 1:
        return None
    mine = list(visible) if trainer_gpus is None else [visible[i] for i in trainer_gpus if i < len(visible)]
    if not mine:
        raise ConfigError(f"stages.{stage}.placement: served models hold all {len(visible)} visible GPUs")
    per_node = min(cluster.gpus_per_node, len(mine))
    pinned = {"CUDA_VISIBLE_DEVICES": ",".join(mine[:per_node])}
    if per_node == 1 and cluster.nnodes == 1:
        return Spawn([sys.executable, *_entry(entry, recipe, stage)], pinned, f"one process on GPU {mine[0]}")
    argv = accelerate_command(entry, recipe, stage, cluster, per_node)
    return Spawn(argv, pinned | ranks_env(cluster), f"accelerate launch, {per_node} processes per node")


def resolve_refs(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """Fill `${NAME}` / `${NAME:-default}` from the environment; an unset name without default fails in one line.
    (`memrl.train.processes.format_command` prints the command with the references left for the shell.)"""
    return [substitute(arg, environ, message=_unset) for arg in argv]


def _unset(name: str) -> str:
    return f"multi-node training: set {name} on every node (NODE_RANK, MASTER_ADDR)"
