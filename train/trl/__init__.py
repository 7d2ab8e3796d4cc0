"""TRL, in this process (CPU, one GPU, or one rank of an `accelerate launch`): SFT, GRPO and the collab agent's
online GRPO, their reward functions, and the stage runner (`backend`)."""
