"""Online RL: the policy plays whole episodes of an environment, and the trainer learns from their outcome. What
both trainers share is here; each trainer's adapter is in its package (memrl.train.trl.collab, memrl.train.verl's
agent loop)."""
