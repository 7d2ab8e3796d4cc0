"""Rewards that play an environment in training: the next-session outcome, on Ray actors or in process, and its
held-out evaluation. Each trainer's adapter is in its package (memrl.train.trl.rewards, memrl.train.verl.rewards).

Pure reward functions and the registry of rewards are in memrl.rewards; `memrl reward list` shows them.
"""
