"""The reward of a collab episode, from what the simulated user experienced: four parts, each its own TRL function.

    task_success  1 when the user's final draft is graded correct, else 0
    user_effort   minus the user's enforcing turns (the paper's user effort: turns spent asking the agent to follow
                  a preference instead of working on the problem)
    preference    the share of the user's preferences the programmatic checkers found met, averaged over the agent's
                  replies the user reacted to, said or cut off by the turn limit (None when there is none: TRL then
                  sums the other parts);
                  graded per preference, so a reply that breaks one preference beats one that breaks two, and a
                  group whose every reply breaks something still has a signal
    length        minus the conversation's messages, both sides

Each part reads the episode record (`CollabEpisode.record()`) that the rollout forwards as the extra field
`episode`; weights come from the recipe (`OutcomeWeights`). An episode the rollout could not finish (a user
simulator failure, the token budget) has no record: every function returns None for it, which TRL 1.16 treats as
unscorable (advantage 0, left out of its group's mean and std). `task_success` also logs how many episodes of the
batch ended each way (`episode/<status>`), so failures are counted where the rewards are, and the share of replies
cut at the reply budget (`episode/replies_cut`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from pydantic import Field

from memrl.core.schema import StrictModel

PARTS = ("task_success", "user_effort", "preference", "length")
STATUSES = ("done", "failed", "over_budget")  # how a rollout's episode ended (the `episode_status` extra field)
REPLIES_CUT = "replies_cut"  # the extra field with the share of an episode's replies cut at the reply budget

RewardFunc = Callable[..., list[float | None]]
Record = Mapping[str, Any]


class OutcomeWeights(StrictModel):
    """GRPO's reward is the weighted sum of the parts (TRL `reward_weights`)."""

    task_success: float = Field(default=1.0, description="weight of the graded answer (0/1)")
    user_effort: float = Field(default=0.2, description="weight of minus the enforcing user turns")
    preference: float = Field(default=0.5, description="weight of the share of preferences met per reply")
    length: float = Field(default=0.02, description="weight of minus the conversation's messages")

    def as_list(self) -> list[float]:
        return [getattr(self, part) for part in PARTS]


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


def outcome_parts(record: Record) -> dict[str, float | None]:
    return {
        "task_success": float(record["task_success"]),
        "user_effort": -float(record["user_effort"]),
        "preference": preference_share(record),
        "length": -float(record["length"]),
    }


def _part(name: str) -> RewardFunc:
    def reward(completions: Sequence[Any], episode: Sequence[Record | None], **kwargs: Any) -> list[float | None]:
        if name == "task_success" and callable(log_metric := kwargs.get("log_metric")):
            statuses = kwargs.get("episode_status") or []
            for status in STATUSES:
                log_metric(f"episode/{status}", float(sum(s == status for s in statuses)))
            if cut := [float(c) for c in kwargs.get(REPLIES_CUT) or [] if c is not None]:
                log_metric(f"episode/{REPLIES_CUT}", sum(cut) / len(cut))
        return [None if record is None else outcome_parts(record)[name] for record in episode]

    reward.__name__ = name  # TRL logs each function as rewards/<__name__>/mean
    return reward


def reward_funcs() -> list[RewardFunc]:
    """One TRL reward function per part, in `PARTS` order (the order of `OutcomeWeights.as_list`)."""
    return [_part(name) for name in PARTS]
