"""TRL, in this process (CPU, one GPU, or one rank of an `accelerate launch`): SFT, GRPO and the collab agent's
online GRPO, their reward functions, and the stage runner (`backend`)."""

from memrl.train.placement import Layout
from memrl.train.registry import TrainedKind, TrainerBackend

LAYOUT = Layout("policy (TRL, one process per GPU)", weights="replicated")
BACKEND = TrainerBackend(
    name="trl",
    summary="in-process on CPU or one GPU, accelerate on several",
    kinds={
        "sft": TrainedKind("memrl.train.trl.backend:SFT", LAYOUT, ("sft/train.jsonl", "sft/eval.jsonl")),
        "grpo": TrainedKind("memrl.train.trl.backend:GRPO", LAYOUT, ("rl/train.jsonl",)),
        "online_grpo": TrainedKind("memrl.train.trl.backend:ONLINE_GRPO", LAYOUT),  # plays its own sessions
    },
    launch="accelerate",
    wandb_env=True,
    resumes=True,
)
