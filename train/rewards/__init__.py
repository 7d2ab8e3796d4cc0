"""Rewards that play an environment in training: the next-session outcome, on Ray actors or in process, and its
held-out evaluation. Each trainer's adapter is in its package (memrl.train.trl.rewards, memrl.train.verl.rewards).

Pure reward functions and the registry of rewards are in memrl.rewards; `memrl reward list` shows them. Importing
this package registers the next-session outcome there, from this layer.
"""

from memrl.rewards.registry import RewardEntry, register
from memrl.train.rewards.next_session import build_scorer, outcome_parts

register(
    RewardEntry(
        "next_session",
        ("outcome",),
        "a next-session reader (an agent model, optionally an LLM judge) and the collab env's rows: reward.outcome",
        build_scorer,
        "share of preferences met in the user's next session with the notes minus without them",
        outcome_parts,
    )
)
