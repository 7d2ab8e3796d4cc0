"""The reward of an MS-TOD proactive episode, from the outcome the world computes: three parts and their weights.

    success        1 when every goal slot was resolved within the turn limit, else 0 (the task outcome)
    slot_accuracy  the share of goal slots the confirmation response states correctly (the slot-filling outcome:
                   `eval tod`'s slot_accuracy of the first reply)
    turns          minus the assistant turns to resolve the task (`dte`; the turn limit when it never resolves)

Each part reads the episode record (`ProactiveEpisode.record()`: `goal`, `outstanding` after each reply, `success`,
`dte`).
"""

from __future__ import annotations

from pydantic import Field

from memrl.rewards.episode import PartWeights, Record


def tod_parts(record: Record) -> dict[str, float | None]:
    goal, left = record["goal"], record["outstanding"][0]  # the slots the confirmation left missing or wrong
    return {
        "success": float(record["success"]),
        "slot_accuracy": 1.0 - len(left) / len(goal) if goal else 1.0,
        "turns": -float(record["dte"]),
    }


class TodRewardWeights(PartWeights):
    """GRPO's reward is the weighted sum of the parts."""

    success: float = Field(default=1.0, description="weight of the task resolved within the turn limit (0/1)")
    slot_accuracy: float = Field(default=1.0, description="weight of the share of goal slots the confirmation states")
    turns: float = Field(default=0.1, description="weight of minus the assistant turns the task took")

    parts = staticmethod(tod_parts)
