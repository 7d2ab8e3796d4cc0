"""The trainer backends: one table, `BACKENDS`, of a trainer's name (a stage's `trainer:`) -> its package, which
declares everything about itself in a `BACKEND` (a `TrainerBackend`): the stage kinds it trains, per kind its stage
runner, the data files it reads and its placement `Layout`, how its processes start, whether it resumes, and what a
Ray job of its stage needs. The stage schemas' `trainer` field (memrl.train.config), placement's layouts and the
app's tables of the training kinds all read this table.

Adding a trainer is its package `train/<name>/` (with `BACKEND` in its `__init__.py`) and one line here. A backend's
runners are named as `module:attribute`, imported when a stage runs, so reading the table loads no trainer.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from memrl.train.placement import Layout

# name -> the package whose `BACKEND` declares it (or the `TrainerBackend` itself). The order is the schema's.
BACKENDS: dict[str, str | TrainerBackend] = {
    "trl": "memrl.train.trl",
    "verl": "memrl.train.verl",
    "llamafactory": "memrl.train.llamafactory",
}


@dataclass(frozen=True)
class StageRunner:
    """A stage runner of a backend that starts its own processes: `run` trains (stage, where, base model, data
    folder), `describe` says what it would do, as lines. `where` is a `stage_run.StageRun`, not named here: the
    stage run reads the online stages' schema, which reads the worlds, and the stage schemas read this table."""

    run: Callable[[Any, Any, str, Path], None]
    describe: Callable[[Any, Any, str, Path], list[str]]


@dataclass(frozen=True)
class InProcessRunner:
    """A stage runner of a backend that trains in this process (`launch: accelerate`): the app runs `train` here or
    in each process of the `accelerate launch` it starts."""

    train: Callable[[Any, Any, str, Path], Path]  # (stage, where, base model, data folder) -> final/
    what: Callable[[Any, str, Path], str]  # (stage, base model, data folder) -> the description
    parts_chart: str = ""  # the reward-parts chart it draws in the stage folder, told with the checkpoint


@dataclass(frozen=True)
class JobGpus:
    """What a Ray job of the stage asks for (memrl.app.stages.base.Job): `gpus` its own process takes, `gpus_if_any`
    where the cluster has GPUs."""

    gpus: int = 0
    gpus_if_any: int = 0


def in_job_processes(stage: Any, raw: dict[str, Any], dashboard: str) -> JobGpus:
    """The default Ray-job hook: the job's own processes train, on the trainer's GPUs where there are some."""
    from memrl.train.placement import trainer_cluster

    return JobGpus(gpus_if_any=trainer_cluster(stage).gpus_per_node)


@dataclass(frozen=True)
class Needs:
    """What a backend's job needs on the machine that runs it, beyond the stage's plan: GPUs (0: none of its own) and
    the modules its processes import, checked by `memrl preflight`."""

    gpus: int = 0
    modules: tuple[str, ...] = ()


def no_needs(stage: Any, plan: str) -> Needs:
    """The default preflight hook: the stage's own process imports what the app already checked."""
    return Needs()


@dataclass(frozen=True)
class TrainedKind:
    """One stage kind a backend trains (`sft`, `grpo`, `online_grpo`: every world's `<world>_grpo`)."""

    runner: str  # `module:attribute`: a StageRunner, or under `launch: accelerate` an InProcessRunner
    layout: Layout  # how it holds its GPUs (memrl.train.placement)
    files: tuple[str, ...] = ()  # the data files it reads, checked before it starts

    def load(self) -> Any:
        module, _, attribute = self.runner.partition(":")
        return getattr(importlib.import_module(module), attribute)


@dataclass(frozen=True)
class TrainerBackend:
    name: str
    summary: str  # one line, in the `trainer` field's description where the schema has one
    kinds: dict[str, TrainedKind]
    # self: its runner starts its own processes; accelerate: it trains in this process, the app starting one per GPU
    # under `accelerate launch` (memrl.app.stages.training).
    launch: Literal["self", "accelerate"] = "self"
    wandb_env: bool = False  # it reads wandb's variables (WANDB_PROJECT, ...), set from the recipe's logging
    resumes: bool = False  # a rerun resumes from its last checkpoint in the stage folder (hf_trainer.resume_point)
    hosts_vllm: bool = False  # it serves the stage's vLLM models itself (the app starts no engine for them)
    job: Callable[[Any, dict[str, Any], str], JobGpus] = field(default=in_job_processes)  # adapts its Ray job entry
    needs: Callable[[Any, str], Needs] = field(default=no_needs)  # (stage, its --dry-run text) -> what preflight checks


def backend(name: str) -> TrainerBackend:
    """The backend registered as `name` (its package imported, not its runners)."""
    entry = BACKENDS[name]
    found: TrainerBackend = importlib.import_module(entry).BACKEND if isinstance(entry, str) else entry
    return found


def names(kind: str) -> tuple[str, ...]:
    """The backends that train stage kind `kind`, in the table's order."""
    return tuple(name for name in BACKENDS if kind in backend(name).kinds)


def trained_kind(stage: Any) -> str:
    """The kind a stage is trained as: every world's `<world>_grpo` is `online_grpo`."""
    return str(getattr(stage, "layout_kind", stage.kind))


def stage_backend(stage: Any) -> tuple[TrainerBackend, TrainedKind] | None:
    """The backend a stage selects and its entry for the stage's kind; None: the stage trains nothing."""
    name = getattr(stage, "trainer", None)
    if name not in BACKENDS:
        return None
    found = backend(name)
    entry = found.kinds.get(trained_kind(stage))
    return None if entry is None else (found, entry)


def admit(kind: str) -> Callable[[Any, Callable[[Any], Any]], Any]:
    """A wrap validator of a schema's `trainer`: a backend registered for `kind` passes, anything else is checked by
    the field's Literal (the built-in names, which the JSON schema and `--help` list), which names the allowed ones."""

    def check(value: Any, handler: Callable[[Any], Any]) -> Any:
        if isinstance(value, str) and value in BACKENDS and kind in backend(value).kinds:
            return value
        return handler(value)

    return check
