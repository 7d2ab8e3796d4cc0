"""LLaMA-Factory: SFT as the YAML `llamafactory-cli train` reads (`backend`), run in its own environment (`venv`)."""

from memrl.train.placement import Layout
from memrl.train.registry import TrainedKind, TrainerBackend

BACKEND = TrainerBackend(
    name="llamafactory",
    summary="LLaMA-Factory's SFT under torchrun, in its own environment",
    # ZeRO-2 shards the optimizer state and gradients; each GPU keeps the whole model. Its data files are checked by
    # backend.dataset_folder.
    kinds={
        "sft": TrainedKind(
            "memrl.train.llamafactory.backend:SFT",
            Layout("policy (LLaMA-Factory under torchrun, ZeRO-2)", weights="replicated"),
        )
    },
    wandb_env=True,
)
