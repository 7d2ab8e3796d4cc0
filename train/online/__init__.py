"""Online RL: the policy plays whole episodes of an environment, and the trainer learns from their outcome."""
