"""Online RL: the policy plays whole episodes of a world the registry trains online (memrl.envs.registry), and the
trainer learns from their outcome. What both trainers share is here; each trainer's adapter is in its package
(memrl.train.trl.online, memrl.train.verl's agent loop)."""
