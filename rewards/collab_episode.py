"""The reward of a collab episode, from what the simulated user experienced: four parts and their weighted sum.

    task_success  1 when the user's final draft is graded correct, else 0
    user_effort   minus the user's enforcing turns (the paper's user effort: turns spent asking the agent to follow
                  a preference instead of working on the problem)
    preference    the share of the user's preferences the programmatic checkers found met, averaged over the agent's
                  replies the user reacted to, said or cut off by the turn limit (None when there is none: TRL then
                  sums the other parts);
                  graded per preference, so a reply that breaks one preference beats one that breaks two, and a
                  group whose every reply breaks something still has a signal
    length        minus the conversation's messages, both sides

Each part reads the episode record (`CollabEpisode.record()`); weights come from the recipe
(`EpisodeRewardWeights`, a `PartWeights`: rewards/episode.py), whose `total` is the one weighted sum.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from pydantic import Field

from memrl.rewards.episode import PartWeights, Record

PARTS = ("task_success", "user_effort", "preference", "length")


def met_share(violated: Sequence[Collection[str]], held: int) -> float:
    """Per reply, the share of the user's `held` preferences not in its `violated` set; their mean (replies >= 1).
    The one measure of preferences met: this part, the held-out report and the next-session outcome."""
    return sum(1.0 - len(set(v)) / max(held, 1) for v in violated) / len(violated)


def preference_share(record: Record) -> float | None:
    """Per reply the user reacted to, the share of its preferences that no checker found violated; their mean (a
    clarifying question, which no answer-format preference applies to, meets them all). The reaction to a last reply
    that time cut off counts too (`unsaid_reaction`): the reply was made, and the policy is trained on it."""
    reactions = [t for t in record["turns"] if t["role"] == "user" and "checker_violated" in t]
    if (unsaid := record.get("unsaid_reaction")) is not None:
        reactions.append(unsaid)
    if not reactions:
        return None
    return met_share([t["checker_violated"] for t in reactions], len(record["preferences"]))


def episode_parts(record: Record) -> dict[str, float | None]:
    return {
        "task_success": float(record["task_success"]),
        "user_effort": -float(record["user_effort"]),
        "preference": preference_share(record),
        "length": -float(record["length"]),
    }


class EpisodeRewardWeights(PartWeights):
    """GRPO's reward is the weighted sum of the parts (TRL `reward_weights`, verl's agent loop `total`)."""

    task_success: float = Field(default=1.0, description="weight of the graded answer (0/1)")
    user_effort: float = Field(default=0.2, description="weight of minus the enforcing user turns")
    preference: float = Field(default=0.5, description="weight of the share of preferences met per reply")
    length: float = Field(default=0.02, description="weight of minus the conversation's messages")

    parts = staticmethod(episode_parts)
