"""A stage kind is one object: its recipe schema, what it does, what it would do, how it ships as a Ray job, and
its CLI face when it has one (an `Action`: `memrl eval tod` is the face of kind `eval_tod`).

Adding a kind is one module that builds a `StageKind` and one line in `registry.KINDS` (for a kind that is also a
command: an `Action`, its stage made by `stages.actions.action_stage`); the recipe schema's discriminated union,
`memrl run`, `--dry-run`, `memrl launch` and the `memrl eval|data` commands all read the registry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, get_args

from memrl.app.actions import Action
from memrl.app.context import RunContext
from memrl.core.schema import StrictModel

C = TypeVar("C", bound=StrictModel)


@dataclass(frozen=True)
class Job:
    """What `memrl launch` needs to know about a stage beyond its recipe entry."""

    gpus: int = 0  # GPUs the job's own process takes (torchrun on the job's node); 0: the stage asks for none
    # GPUs it takes where the cluster has any: a trainer that also runs on CPU (TRL, LLaMA-Factory, the judger in
    # one process). Asked of a CPU-only cluster, the job would never be scheduled; not asked of a GPU one, Ray may
    # start it on a node without GPUs (often the head) or beside another job on the same GPUs.
    gpus_if_any: int = 0
    notes: tuple[str, ...] = ()  # told to the user before submission


def model_keys(stage: Any, models: Mapping[str, Any]) -> list[str]:
    """The recipe's `models` keys a stage names in its own string fields (`model: policy`, `gold: teacher`, ...)."""
    dumped = stage.model_dump()
    values = [v for v in dumped.values() if isinstance(v, str)]
    values += [v for d in dumped.values() if isinstance(d, dict) for v in d.values() if isinstance(v, str)]
    return sorted({v for v in values if v in models})


def inprocess_gpus(stage: Any, models: Mapping[str, Any]) -> int:
    """GPUs the stage's own process takes for the vLLM engines it runs itself (`backend: vllm` models it names, such
    as an evaluation's policy): the widest tensor parallelism among them; 0: none, or a trainer that hosts them
    (verl). `memrl launch` asks Ray for these and `memrl preflight` counts them: one number for both."""
    from memrl.rollout.config import VLLMModelConfig
    from memrl.train.registry import stage_backend

    if (found := stage_backend(stage)) is not None and found[0].hosts_vllm:
        return 0
    engines = [models[k] for k in model_keys(stage, models) if isinstance(models[k], VLLMModelConfig)]
    return max((m.tensor_parallel_size for m in engines), default=0)


def as_is(stage: Any, raw: dict[str, Any], name: str, dashboard: str) -> Job:
    """Most stages run inside a Ray job exactly as they run on a workstation."""
    return Job()


def local_model_notes(stage: str, section: dict[str, Any]) -> tuple[str, ...]:
    """Models an environment config serves on the job's node: actors elsewhere in the cluster cannot reach them."""
    return tuple(
        f"stage {stage}: {role} {cfg.get('model')!r} is served on the job's node at 127.0.0.1; actors on other "
        "machines reach only models with an `endpoint:`"
        for role, cfg in section.items()
        if isinstance(cfg, dict) and cfg.get("backend") in ("hf", "vllm")
    )


def on_the_cluster(section: dict[str, Any], name: str) -> Job:
    """An environment run inside a Ray job spreads its actors over the cluster the job runs on."""
    section["ray_address"] = "auto"
    return Job(notes=local_model_notes(name, section))


@dataclass(frozen=True)
class StageKind(Generic[C]):
    config: type[C]  # a StrictModel with `kind: Literal["<name>"]`
    run: Callable[[C, RunContext, str], None]  # (stage, run context, stage name): do the work, resume if half done
    dry_run: Callable[[C, RunContext, str], list[str]]  # what `run` would do, as lines; touches nothing
    # Adapts the stage's entry of the job recipe (in place) to a cluster and says what its Ray job needs.
    job: Callable[[C, dict[str, Any], str, str], Job] = field(default=as_is)
    refs: tuple[str, ...] = ()  # fields that may name an earlier stage of the recipe (its output folder)
    needs: tuple[str, ...] = ()  # refs whose stage's spec the runner gets (ctx.needs); the rest only name a folder
    action: Action[Any] | None = None  # its CLI face (`memrl <action.command>`), the same work from flags; None: none

    @property
    def name(self) -> str:
        return str(get_args(self.config.model_fields["kind"].annotation)[0])
