"""Every reward memrl trains with, by name: its parts (what trainers log), what it needs, and where it is built.

`memrl reward list` prints this table. A reward whose factory lives above this layer (it plays an environment) is
named by its import path, never imported from here; tests check that every factory resolves and that each entry's
parts are what the trainer adapters produce.
"""

from __future__ import annotations

from dataclasses import dataclass

from memrl.rewards.collab_episode import PARTS as EPISODE_PARTS


@dataclass(frozen=True)
class RewardEntry:
    name: str
    parts: tuple[str, ...]  # the values trainers log and weight (TRL: one reward function each)
    needs: str  # what scoring a sample takes
    factory: str  # "module:attribute" that builds or computes it
    summary: str


REWARDS: dict[str, RewardEntry] = {
    entry.name: entry
    for entry in (
        RewardEntry(
            "coverage",
            ("coverage",),
            "ground truth preferences (the session's enforcements, gold notes) and a judge (offline MiniLM or an LLM)",
            "memrl.rewards.judge:build_judge",
            "how much of the user's preferences the reflection's notes hold (judge 0-3 / 3)",
        ),
        RewardEntry(
            "format",
            ("format",),
            "the reply text",
            "memrl.rewards.format:format_reward",
            "does the reply keep the reflection's JSON contract (credit 0 to 1)",
        ),
        RewardEntry(
            "length",
            ("length_penalty",),
            "the reply text and reward.length_penalty",
            "memrl.rewards.reward:length_penalty",
            "minus a penalty per token over the notes' budget",
        ),
        RewardEntry(
            "next_session",
            ("outcome",),
            "a next-session reader (an agent model, optionally an LLM judge) and the collab env's rows: reward.outcome",
            "memrl.train.rewards.next_session:build_scorer",
            "share of preferences met in the user's next session with the notes minus without them",
        ),
        RewardEntry(
            "collab_episode",
            EPISODE_PARTS,
            "a finished collab episode's record (online collab RL)",
            "memrl.rewards.collab_episode:episode_parts",
            "the collab episode's parts, summed with the stage's reward weights",
        ),
    )
}
