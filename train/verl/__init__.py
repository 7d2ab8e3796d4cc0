"""verl on GPU clusters: a stage becomes Hydra overrides (`overrides`, `collab_overrides`), checked against verl's
own config on CPU (`validate`), then a command (`command`); the stage runner is `backend`. The modules verl's own
processes import by name live here too: its entry (`main`), reward function (`rewards`), advantage estimator
(`advantage`) and agent loop (`agent_loop`)."""

from typing import Any

from memrl.train.placement import Layout
from memrl.train.registry import JobGpus, Needs, TrainedKind, TrainerBackend

ROLLOUT = Layout("policy (verl actor + rollout)", rollout=True)
V1 = ("verl", "transfer_queue", "verl.trainer.ppo.v1.trainer_base", "verl.trainer.ppo.v1.agent_loop_tq")
# What an attention implementation named in the overrides needs importable (sdpa and eager are torch's own).
ATTENTION_KERNELS = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}


def _job(stage: Any, raw: dict[str, Any], dashboard: str) -> JobGpus:
    from memrl.train.verl.backend import job

    return job(stage, raw, dashboard)


def _needs(stage: Any, plan: str) -> Needs:
    """The node's GPUs, verl's V1 runner with transfer_queue, its entry, vLLM for GRPO and the attention kernel the
    overrides in the plan name."""
    sft = stage.kind == "sft"
    modules = [*V1, "verl.trainer.sft_trainer" if sft else "verl.trainer.main_ppo", *([] if sft else ["vllm"])]
    modules += [module for attn, module in ATTENTION_KERNELS.items() if f"attn_implementation={attn}" in plan]
    return Needs(gpus=stage.cluster.gpus_per_node, modules=tuple(modules))


BACKEND = TrainerBackend(
    name="verl",
    summary="Ray and vLLM",
    kinds={
        "sft": TrainedKind(
            "memrl.train.verl.backend:SFT", Layout("policy (verl SFT)"), ("sft/train.parquet", "sft/eval.parquet")
        ),
        "grpo": TrainedKind("memrl.train.verl.backend:GRPO", ROLLOUT, ("rl/train.parquet", "rl/eval.parquet")),
        "online_grpo": TrainedKind("memrl.train.verl.backend:ONLINE_GRPO", ROLLOUT),  # every world's `<world>_grpo`
    },
    hosts_vllm=True,  # its rollout, and a judge its reward model serves
    job=_job,
    needs=_needs,
)
