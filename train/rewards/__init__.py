"""Rewards in training: every trainer adapter (TRL reward functions, verl's compute_score and advantage estimator)
and the rewards that play an environment (the next-session outcome, on Ray actors or in process).

Pure reward functions and the registry of rewards are in memrl.rewards; `memrl reward list` shows them.
"""
