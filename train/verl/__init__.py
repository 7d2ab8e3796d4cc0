"""verl on GPU clusters: a stage becomes Hydra overrides (`overrides`, `collab_overrides`), checked against verl's
own config on CPU (`validate`), then a command (`command`); the stage runner is `backend`. The modules verl's own
processes import by name live here too: its entry (`main`), reward function (`rewards`), advantage estimator
(`advantage`) and agent loop (`agent_loop`)."""

from typing import Any

from memrl.train.placement import Layout
from memrl.train.registry import JobGpus, TrainedKind, TrainerBackend

ROLLOUT = Layout("policy (verl actor + rollout)", rollout=True)


def _job(stage: Any, raw: dict[str, Any], dashboard: str) -> JobGpus:
    from memrl.train.verl.backend import job

    return job(stage, raw, dashboard)


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
)
