"""verl: a stage becomes a command line, checked against verl's own config on CPU, run into the stage's `final/`.

One command builder for the three stage kinds (`sft`, `grpo`, online `<world>_grpo`): each names its overrides, the
endpoints a multi-node run must reach and what its environment adds. `--dry-run` prints the command `run` executes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from memrl.core import interrupts
from memrl.core.checkpoints import adapter_base, final_dir, is_adapter, portable_ref, resolve_model
from memrl.train.config import GRPOStage, LoraConfig, SFTStage
from memrl.train.placement import trainer_cluster, trainer_env
from memrl.train.registry import JobGpus, StageRunner
from memrl.train.stage_run import CURVES_FILE, StageRun

if TYPE_CHECKING:
    from memrl.train.endpoints import Endpoint
    from memrl.train.online.config import OnlineGRPOStage

PARTS_CURVES_FILE = "reward_parts.png"  # an online stage's reward parts per step
RAY_JOB_OVERRIDE = "+ray_kwargs.ray_init.address=auto"


@dataclass(frozen=True)
class VerlCommand:
    """A verl stage's command line, its environment, and the model path it starts from."""

    argv: list[str]
    env: dict[str, str] | None
    model_path: str


def verl_start(ref: str, planned: Collection[str], dry_run: bool) -> tuple[str, str | None]:
    """(model path, LoRA adapter or None) to start from. `planned`: the folders of this run's stages, so that a
    stage that has not run yet is named by its plan."""
    final = final_dir(Path(ref))
    if is_adapter(final):
        return resolve_model(adapter_base(final)), str(final)
    if final.is_dir():
        return str(final), None
    if ref in planned:
        return str(Path(ref) / "final"), None  # an earlier stage of this run; its final/ is where it will be
    return (ref if dry_run else resolve_model(ref)), None


def join_job_cluster(raw: dict[str, Any]) -> None:
    """A stage's recipe entry inside a Ray job: verl joins the job's cluster (RAY_ADDRESS, set by Ray for every job)
    instead of starting its own Ray."""
    raw.setdefault("cluster", {})["ray_address"] = None
    raw["overrides"] = [*raw.get("overrides", []), RAY_JOB_OVERRIDE]


def job(stage: SFTStage | GRPOStage | OnlineGRPOStage, raw: dict[str, Any], dashboard: str) -> JobGpus:
    """A verl stage inside a Ray job: GRPO (the reflector's and every world's) joins the job's cluster instead of
    starting its own Ray; SFT runs on the job's own node under torchrun, or on several nodes as its own Ray job."""
    if not isinstance(stage, SFTStage):
        # The reward function is named by module already (memrl.train.verl.rewards.reward_path), outcome included.
        join_job_cluster(raw)
        return JobGpus()
    cluster = raw["cluster"]
    if stage.cluster.nnodes > 1:
        # verl's SFT on several nodes runs only as its own Ray job (sft_trainer_ray through `ray job submit`):
        # hand it this cluster's job server.
        cluster["ray_address"] = dashboard
        return JobGpus()
    cluster["ray_address"] = None
    # torchrun on the job's own node, on the GPUs its placement plan leaves the trainer (not the served models')
    return JobGpus(gpus=trainer_cluster(stage).gpus_per_node)


# ---- the command ------------------------------------------------------------------------------------------------


def _run_args(where: StageRun, model_path: str) -> dict[str, Any]:
    """The overrides' arguments every verl stage shares: model, output, and how the run is named and logged."""
    return {
        "model_path": model_path,
        "out_dir": where.out_dir,
        "experiment": where.experiment,
        "project": where.project,
        "logger": where.logger,
        "seed": where.seed,
    }


def _command(
    kind: Literal["grpo", "sft"],
    stage: Any,
    overrides: list[str],
    model_path: str,
    env: Callable[[], dict[str, str]],
    endpoints: Sequence[Endpoint] = (),
) -> VerlCommand:
    from memrl.train.verl.command import refuse_local_endpoints, verl_command
    from memrl.train.verl.validate import PPO_CONFIG, SFT_CONFIG, validate_overrides

    validate_overrides(PPO_CONFIG if kind == "grpo" else SFT_CONFIG, overrides)  # on CPU, before any GPU
    refuse_local_endpoints(list(endpoints), stage.cluster)
    full = dict(os.environ) | env()  # verl.main hands memrl's variables to every worker
    full |= trainer_env(stage)  # the trainer's GPUs only: served models keep the others (train/placement.py)
    return VerlCommand(verl_command(kind, overrides, trainer_cluster(stage), environ=full), full, model_path)


def sft_command(stage: SFTStage, where: StageRun, base: str, data: Path, dry_run: bool) -> VerlCommand:
    from memrl.train.verl.metrics import tracking_env
    from memrl.train.verl.overrides import sft_overrides, verl_modules

    model_path, _ = verl_start(base, where.planned, dry_run)
    overrides = sft_overrides(stage, **_run_args(where, model_path), data_dir=data, resume=True)
    # verl's SFT loggers run in the command's own process: their paths go in its environment.
    return _command(
        "sft", stage, overrides, model_path, lambda: tracking_env(where.out_dir, wandb=where.wandb) | verl_modules()
    )


def grpo_command(stage: GRPOStage, where: StageRun, base: str, data: Path, dry_run: bool) -> VerlCommand:
    from memrl.train.endpoints import stage_endpoints
    from memrl.train.verl.command import job_env
    from memrl.train.verl.overrides import grpo_overrides

    model_path, adapter = verl_start(stage.init or base, where.planned, dry_run)
    overrides = grpo_overrides(stage, **_run_args(where, model_path), data_dir=data, lora_adapter_path=adapter)
    # the keys and the unscored stop (never on the command line)
    return _command("grpo", stage, overrides, model_path, lambda: job_env(stage), stage_endpoints(stage))


def online_command(stage: OnlineGRPOStage, where: StageRun, base: str, data: Path, dry_run: bool) -> VerlCommand:
    """The reflector's GRPO command with the world's agent loop (`memrl_<world>`): the LLM user's key and the
    unscored stop."""
    from memrl.rewards.config import UnscoredStop
    from memrl.train.verl.command import unscored_job_env
    from memrl.train.verl.online_overrides import loop_settings, online_overrides, user_endpoints

    model_path, adapter = verl_start(stage.init or base, where.planned, dry_run)
    overrides = online_overrides(stage, **_run_args(where, model_path), lora_adapter_path=adapter)
    users = user_endpoints(stage)
    env = lambda: loop_settings(stage).user_key() | unscored_job_env(UnscoredStop(), users)  # noqa: E731
    return _command("grpo", stage, overrides, model_path, env, users)


# ---- run and describe -------------------------------------------------------------------------------------------


def run_command(command: VerlCommand, where: StageRun, *, base: str, trainer: str, lora: LoraConfig | None) -> Path:
    """Run a verl stage's command, draw its curves (a failed run's too), and merge its last checkpoint into
    `final/`."""
    from memrl.train.curves import verl_chart
    from memrl.train.verl import metrics as verl_metrics
    from memrl.train.verl.command import run_verl
    from memrl.train.verl.merge import save_final

    out = where.out_dir
    out.mkdir(parents=True, exist_ok=True)  # verl's file logger opens its file without creating the folder
    verl_metrics.archive(out)  # verl's file logger would truncate a resumed run's earlier curve
    try:
        run_verl(command.argv, out / "verl.log", env=command.env)  # raises MemrlError with the log's tail on failure
    finally:  # a stopped run's curves are drawn when it resumes
        if not interrupts.stopping():
            verl_chart(verl_metrics.read(out), out / CURVES_FILE, title=f"{where.recipe}: {where.stage} ({trainer})")
    alpha = lora.alpha if lora is not None else None
    return save_final(out, base=base, trainer=trainer, stage=where.stage, lora_alpha=alpha)


def run_sft(stage: SFTStage, where: StageRun, base: str, data: Path) -> None:
    command = sft_command(stage, where, base, data, dry_run=False)
    run_command(command, where, base=portable_ref(base), trainer="verl-sft", lora=stage.lora)


def run_grpo(stage: GRPOStage, where: StageRun, base: str, data: Path) -> None:
    from memrl.train.endpoints import require_reachable, stage_endpoints

    require_reachable(stage_endpoints(stage))  # a dead judge fails here, in seconds, before verl takes the GPUs
    command = grpo_command(stage, where, base, data, dry_run=False)
    run_command(command, where, base=portable_ref(command.model_path), trainer="verl-grpo", lora=stage.lora)


def run_online(stage: OnlineGRPOStage, where: StageRun, base: str, data: Path) -> None:
    """Write the sessions as agent-loop data into `data`, run verl, and chart the reward parts (a failed run's
    too)."""
    from memrl.train.online.charts import outcome_chart
    from memrl.train.online.episodes import episode_rows
    from memrl.train.verl.online_data import EVAL_FILE, TRAIN_FILE, agent_rows, write_rows
    from memrl.train.verl.online_overrides import ROLLOUTS_SUBDIR, loop_settings
    from memrl.train.verl.online_rollouts import rollout_history

    out = where.out_dir
    rows = agent_rows(episode_rows(stage.env), loop_settings(stage))  # a bad task or data folder fails here
    # verl validates (greedily) on the training sessions; held-out ones are the world's evaluation's.
    for file in (TRAIN_FILE, EVAL_FILE):
        write_rows(rows, data / file)
    command = online_command(stage, where, base, data, dry_run=False)
    trainer = f"verl-{stage.world}-grpo"
    try:
        run_command(command, where, base=portable_ref(command.model_path), trainer=trainer, lora=stage.lora)
    finally:  # the parts of a failed run are worth seeing too (a stopped one's: when it resumes)
        if not interrupts.stopping():
            title, parts = f"{where.recipe}: {where.stage} reward parts (verl)", stage.reward.names()
            outcome_chart(rollout_history(out / ROLLOUTS_SUBDIR, parts), out / PARTS_CURVES_FILE, title, parts)
    where.console.print(
        f"{where.stage}: checkpoint {out / 'final'}; reward parts per step in {out / PARTS_CURVES_FILE}"
    )


def placement_lines(stage: SFTStage | GRPOStage | OnlineGRPOStage, base: str) -> list[str]:
    """The stage's `placement:` block (memrl.train.placement): GPUs and memory fraction per model; a plan that
    cannot fit the node is refused here, in one line."""
    from memrl.train.placement import stage_plan

    return [stage_plan(stage, base).text()]


def _shown(command: VerlCommand) -> str:
    from memrl.train.verl.command import format_command

    return format_command(command.argv)


def budget_lines(stage: SFTStage | GRPOStage | OnlineGRPOStage) -> list[str]:
    """How the stage's micro batches are packed by tokens, with the arithmetic (memrl.train.verl.overrides)."""
    from memrl.train.verl.overrides import policy_budget, sft_budget

    budget = sft_budget(stage) if isinstance(stage, SFTStage) else policy_budget(stage)
    return ["\n".join(budget.lines())]


def describe_sft(stage: SFTStage, where: StageRun, base: str, data: Path) -> list[str]:
    command = _shown(sft_command(stage, where, base, data, dry_run=True))
    return [command, *budget_lines(stage), *placement_lines(stage, base)]


def describe_grpo(stage: GRPOStage, where: StageRun, base: str, data: Path) -> list[str]:
    command = _shown(grpo_command(stage, where, base, data, dry_run=True))
    return [command, *budget_lines(stage), *placement_lines(stage, base)]


def describe_online(stage: OnlineGRPOStage, where: StageRun, base: str, data: Path) -> list[str]:
    from memrl.train.stage_run import sessions
    from memrl.train.verl.online_data import agent_name

    loop = agent_name(stage.world)
    return [
        f"verl agent loop {loop} from {stage.init or base}: {sessions(stage)}; sessions written to {data}",
        _shown(online_command(stage, where, base, data, dry_run=True)),
        *budget_lines(stage),
        *placement_lines(stage, base),
    ]


SFT = StageRunner(run_sft, describe_sft)
GRPO = StageRunner(run_grpo, describe_grpo)
ONLINE_GRPO = StageRunner(run_online, describe_online)
