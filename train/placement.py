"""Where a GPU stage's models run on its node, and the check that they fit before anything starts.

Every trainer a stage can select (verl, TRL under accelerate, LLaMA-Factory and the judger under torchrun) trains on
the node's GPUs, one process per GPU; each served model the stage relies on (judge, user, teacher, outcome agents)
runs either at an `endpoint` on another host (nothing reserved here) or on this node, on `gpus` reserved for it with
vLLM's `--gpu-memory-utilization` as `memory_fraction`. The trainer gets the GPUs left, and its processes see only
those (`trainer_env`). A plan that cannot fit is refused in one line: fractions over 1 on a GPU, a model whose bf16
weights (estimated from the parameter count in its name) exceed its GPUs' memory share, a reserved GPU the node does
not have, or no GPU left to train on. `stage_plan` is the plan of a stage for the trainer it selects: the `Layout` its
backend declares for the stage's kind (train/registry.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, NonNegativeInt, PositiveFloat, Tag, field_validator

from memrl.core.errors import ConfigError
from memrl.core.schema import StrictModel
from memrl.rollout.config import VLLMModelConfig
from memrl.train.registry import stage_backend

DEFAULT_GPU_MEMORY_GIB = 80.0
BYTES_PER_PARAM = 2  # bf16 weights, as vLLM and verl load these models
# Placement roles, and the endpoint roles (train/endpoints.py) each one covers.
ROLES = ("judge", "user", "teacher", "outcome")
_ROLE_OF = {
    "judge": "judge",
    "user": "user",
    "teacher": "teacher",
    "outcome agent": "outcome",
    "outcome judge": "outcome",
}
_PARAMS = re.compile(r"(?:^|[-_/ ])(\d+(?:\.\d+)?)([bBmM])(?=$|[-_/ .])")
_GIB = 1024**3


class Reserved(StrictModel):
    """A model served on this node (`vllm serve`, tensor-parallel over its GPUs), kept out of the trainer's GPUs."""

    gpus: list[NonNegativeInt] = Field(min_length=1, description="GPU indices on this node")
    memory_fraction: float = Field(default=0.9, gt=0, le=1, description="vLLM's --gpu-memory-utilization")

    @field_validator("gpus")
    @classmethod
    def _distinct(cls, gpus: list[int]) -> list[int]:
        if len(set(gpus)) != len(gpus):
            raise ValueError(f"placement: gpus {gpus} name a GPU twice")
        return gpus


def _where_tag(value: Any) -> str:
    return "endpoint" if isinstance(value, str) else "reserved"


# `endpoint`, or a mapping validated as Reserved: an error names the one branch the value meant.
Where = Annotated[
    Annotated[Literal["endpoint"], Tag("endpoint")] | Annotated[Reserved, Tag("reserved")],
    Discriminator(_where_tag),
]


class Placement(StrictModel):
    """Where the models of a GPU stage run: `endpoint` (another host) or reserved GPUs of this node."""

    gpu_memory_gib: PositiveFloat = Field(
        default=DEFAULT_GPU_MEMORY_GIB, description="memory of one GPU (`memrl preflight` measures the real one)"
    )
    rollout_memory_fraction: float = Field(
        default=0.5, gt=0, le=1, description="verl's vLLM rollout: gpu_memory_utilization on the trainer's GPUs"
    )
    judge: Where = "endpoint"
    user: Where = "endpoint"
    teacher: Where = "endpoint"
    outcome: Where = Field(default="endpoint", description="the outcome reward's agent and judge")


@dataclass(frozen=True)
class Placed:
    """One model in the plan: on `gpus` of this node with `memory_fraction`, or (no GPUs) at an endpoint."""

    role: str
    model: str | None
    gpus: tuple[int, ...] = ()
    memory_fraction: float | None = None
    where: str = ""
    tp: int = 1  # the GPUs one copy of the weights is split over

    def line(self) -> str:
        name = self.model or "its server (this stage does not call it)"
        if not self.gpus:
            return f"  {self.role}: {name} at {self.where or 'an endpoint'} (nothing reserved here)"
        share = f"memory fraction {self.memory_fraction:g}" if self.memory_fraction is not None else "all memory"
        layout = self.where in WEIGHTS
        split = WEIGHTS[self.where] if layout else f"TP {self.tp}"
        where = f", {self.where}" if self.where and not layout else ""
        return f"  {self.role}: {name} on GPUs {_span(self.gpus)}, {share}, {split}{where}"


@dataclass(frozen=True)
class Plan:
    node_gpus: int
    gpu_memory_gib: float
    trainer_gpus: tuple[int, ...]
    placed: tuple[Placed, ...]

    def lines(self) -> list[str]:
        head = f"placement: {self.node_gpus} GPUs of {self.gpu_memory_gib:g} GiB on this node"
        n = len(self.trainer_gpus)
        sees = (
            f"CUDA_VISIBLE_DEVICES={self.visible_devices}"
            if n < self.node_gpus
            else f"CUDA_VISIBLE_DEVICES as given (all {n} GPUs)"
        )
        processes = f"  trainer processes: {n} on this node, one per GPU, each started with {sees}"
        return [head, *(p.line() for p in self.placed), processes]

    def text(self) -> str:
        return "\n".join(self.lines())

    @property
    def visible_devices(self) -> str:
        """CUDA_VISIBLE_DEVICES for the trainer's processes (and the Ray node verl starts)."""
        return ",".join(map(str, self.trainer_gpus))


def rollout_tp(gpus: int) -> int:
    """verl's rollout tensor parallelism on `gpus` training GPUs: 2 where they pair up, else 1."""
    return 2 if gpus % 2 == 0 else 1


def params_billions(model: str) -> float | None:
    """The parameter count a model name states (`Llama-3.3-70B` -> 70, `smollm2-135m` -> 0.135); None if it states
    none (a local path, an embedded name without a size)."""
    match = _PARAMS.search(model)
    if match is None:
        return None
    value = float(match.group(1))
    return value / 1000 if match.group(2) in "mM" else value


def weights_gib(model: str, tensor_parallel: int = 1) -> float | None:
    """bf16 weights per GPU of `model` split over `tensor_parallel` GPUs, in GiB (None: size unknown)."""
    billions = params_billions(model)
    return None if billions is None else billions * 1e9 * BYTES_PER_PARAM / tensor_parallel / _GIB


@dataclass(frozen=True)
class Layout:
    """How a trainer holds its GPUs: its name in the plan, whether verl's vLLM rollout (and a judge verl hosts)
    shares them, and how the weights lie over them (`sharded`: FSDP, ZeRO-3; `replicated`: a full copy per GPU)."""

    label: str
    rollout: bool = False
    weights: Literal["sharded", "replicated"] = "sharded"


WEIGHTS = {"sharded": "weights sharded", "replicated": "full weights on each GPU"}


def layout(stage: Any) -> Layout | None:
    """The layout of the trainer `stage` selects; None: the stage trains nothing."""
    if stage.kind == "judger":
        return Layout("judger (torchrun)", weights="sharded" if stage.deepspeed == "zero3" else "replicated")
    found = stage_backend(stage)  # the backend declares a layout per kind it trains
    return None if found is None else found[1].layout


def stage_plan(stage: Any, policy: str | None, *, gpu_memory_gib: float | None = None) -> Plan:
    """`plan` for the trainer the stage selects (its backend's `Layout`)."""
    how = layout(stage)
    if how is None:
        raise ConfigError(f"placement: a {stage.kind} stage trains nothing; it has no plan")
    memory = gpu_memory_gib
    return plan(stage, policy, trainer=how.label, rollout=how.rollout, weights=how.weights, gpu_memory_gib=memory)


def plan(
    stage: Any,
    policy: str | None,
    *,
    trainer: str = "policy (verl actor + rollout)",
    rollout: bool = True,
    weights: Literal["sharded", "replicated"] = "sharded",
    gpu_memory_gib: float | None = None,
) -> Plan:
    """The plan of a GPU stage (anything with `cluster` and, optionally, `placement`): raises ConfigError in one line
    when it cannot fit. `policy` is the trained model's name or path; `rollout` says whether the trainer runs verl's
    vLLM rollout on its GPUs (verl GRPO) or only trains (SFT, TRL, the judger), `weights` how a trainer that only
    trains holds the model; `gpu_memory_gib` (measured) wins over the recipe's."""
    from memrl.train.endpoints import stage_models

    placement: Placement = getattr(stage, "placement", None) or Placement()
    memory = gpu_memory_gib or placement.gpu_memory_gib
    node = stage.cluster.gpus_per_node
    models = stage_models(stage)
    reserved = {role: where for role in ROLES if isinstance(where := getattr(placement, role), Reserved)}
    if reserved and stage.cluster.nnodes > 1:
        raise ConfigError(
            f"placement: {', '.join(reserved)} on reserved GPUs of one node, but the stage spans {stage.cluster.nnodes}"
            " nodes: serve them on their own host and set placement.<role>: endpoint"
        )
    placed: list[Placed] = []
    for role, where in reserved.items():
        bad = [g for g in where.gpus if g >= node]
        if bad:
            raise ConfigError(f"placement.{role}: GPU {bad[0]} is not on this node (cluster.gpus_per_node {node})")
        served: list[str | None] = [*_served(role, models)] or [None]
        for model in served:
            url = _url(role, models, model)
            placed.append(Placed(role, model, tuple(where.gpus), where.memory_fraction, url, len(where.gpus)))
    taken = {g for p in placed for g in p.gpus}
    trainer_gpus = tuple(g for g in range(node) if g not in taken)
    if not trainer_gpus:
        raise ConfigError(f"placement: the served models take all {node} GPUs; none is left to train on")
    if rollout:
        fraction, tp = placement.rollout_memory_fraction, rollout_tp(len(trainer_gpus))
        train = [Placed(trainer, policy, trainer_gpus, fraction, "vLLM rollout", tp)]
        train += _hosted_judge(stage, trainer_gpus)
    else:
        split = len(trainer_gpus) if weights == "sharded" else 1
        train = [Placed(trainer, policy, trainer_gpus, None, weights, split)]
    for role, model in models.items():
        if getattr(model, "backend", None) == "openai" and _ROLE_OF.get(role, role) not in reserved:
            placed.append(Placed(role, model.model, where=model.endpoint))
    result = Plan(node, memory, trainer_gpus, (*train, *placed))
    _check(result)
    return result


def trainer_cluster(stage: Any) -> Any:
    """The stage's `cluster` as the trainer sees it: `gpus_per_node` is the GPUs no served model reserves (verl's
    trainer.n_gpus_per_node and rollout TP, torchrun's processes). The plan is checked on the way."""
    left = len(plan(stage, None).trainer_gpus)
    return (
        stage.cluster
        if left == stage.cluster.gpus_per_node
        else stage.cluster.model_copy(update={"gpus_per_node": left})
    )


def trainer_env(stage: Any) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES for the trainer's processes (and the Ray that verl starts) when served models keep GPUs
    of this node; nothing when the trainer has them all."""
    result = plan(stage, None)
    return {} if len(result.trainer_gpus) == result.node_gpus else {"CUDA_VISIBLE_DEVICES": result.visible_devices}


def _served(role: str, models: dict[str, Any]) -> list[str]:
    """Distinct model names the stage calls in a placement role (an endpoint shared by two roles is one server)."""
    names = {(m.model, getattr(m, "endpoint", "")) for r, m in models.items() if _ROLE_OF.get(r) == role}
    return sorted({name for name, _ in names})


def _url(role: str, models: dict[str, Any], model: str | None) -> str:
    urls = {getattr(m, "endpoint", "") for r, m in models.items() if _ROLE_OF.get(r) == role and m.model == model}
    return ", ".join(sorted(u for u in urls if u))


def _hosted_judge(stage: Any, trainer_gpus: tuple[int, ...]) -> list[Placed]:
    """A vLLM judge verl serves itself shares the trainer's GPUs (verl's reward model, 0.5 unless the recipe says)."""
    judge = getattr(getattr(getattr(stage, "reward", None), "judge", None), "model", None)
    if not isinstance(judge, VLLMModelConfig):
        return []
    fraction = judge.gpu_memory_utilization if "gpu_memory_utilization" in judge.model_fields_set else 0.5
    return [Placed("judge (hosted by verl)", judge.model, trainer_gpus, fraction, "", judge.tensor_parallel_size)]


def _check(result: Plan) -> None:
    """Fractions per GPU at most 1, and each model's weights within its share of its GPUs."""
    per_gpu: dict[int, list[Placed]] = {}
    for p in result.placed:
        for g in p.gpus:
            if p.memory_fraction is not None:
                per_gpu.setdefault(g, []).append(p)
    for gpu, there in sorted(per_gpu.items()):
        total = sum(p.memory_fraction or 0 for p in there)
        if total > 1 + 1e-9:
            parts = " + ".join(f"{p.role} {p.memory_fraction:g}" for p in there)
            raise ConfigError(f"placement: GPU {gpu} is asked for {parts} = {total:g} of its memory, over 1")
    for p in result.placed:
        if not p.gpus or p.model is None:
            continue
        need = weights_gib(p.model, p.tp)
        share = (p.memory_fraction if p.memory_fraction is not None else 1.0) * result.gpu_memory_gib
        if need is not None and need > share:
            raise ConfigError(
                f"placement: {p.role} {p.model} needs ~{need:.0f} GiB of bf16 weights per GPU on {p.tp} GPU(s), over "
                f"its share {share:.0f} GiB ({p.memory_fraction or 1:g} x {result.gpu_memory_gib:g} GiB): "
                "give it more GPUs or serve it at an endpoint on another host"
            )


def _span(gpus: tuple[int, ...]) -> str:
    return ",".join(map(str, gpus))
