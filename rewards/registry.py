"""Every reward memrl trains with, by name: its parts (what trainers log), what it needs, what computes it, and, for
the reflection reward, the factory that builds its parts from the reward config.

`memrl reward list` prints this table. The reflection reward is the entries with a `build`, in registry order
(`reflection_parts`). A reward built above this layer registers itself from there (`register`): the next-session
outcome at import of memrl.train.rewards, each online world's episode reward (`<world>_episode`) at import of
memrl.envs.registry. This module never names a module above it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memrl.core.errors import ConfigError
from memrl.rewards.config import RewardConfig
from memrl.rewards.format import format_reward
from memrl.rewards.judge import build_judge, coverage_parts, format_parts, length_parts
from memrl.rewards.parts import PartContext, RewardPart
from memrl.rewards.reward import length_penalty

PartFactory = Callable[[PartContext], list[RewardPart]]  # [] where the config leaves the reward out


@dataclass(frozen=True)
class RewardEntry:
    name: str
    parts: tuple[str, ...]  # the values trainers log and weight (TRL: one reward function each)
    needs: str  # what scoring a sample takes
    factory: Callable[..., Any]  # what builds or computes it
    summary: str
    build: PartFactory | None = None  # its parts of the reflection reward; None: a reward of its own

    def row(self) -> dict[str, Any]:
        """The entry as `memrl reward list --json` prints it."""
        factory = f"{self.factory.__module__}:{self.factory.__qualname__}"
        return {
            "name": self.name,
            "parts": list(self.parts),
            "needs": self.needs,
            "factory": factory,
            "summary": self.summary,
        }


REWARDS: dict[str, RewardEntry] = {}


def register(entry: RewardEntry) -> RewardEntry:
    """Add a reward; a name is registered once."""
    if entry.name in REWARDS:
        raise ValueError(f"reward {entry.name!r} is registered already")
    REWARDS[entry.name] = entry
    return entry


def listed() -> list[RewardEntry]:
    """The entries as `memrl reward list` shows them: the reflection reward's parts first, in registry order."""
    return sorted(REWARDS.values(), key=lambda entry: entry.build is None)


def reflection_parts(
    cfg: RewardConfig, data_dir: Path | None = None, shared: Mapping[str, Any] | None = None
) -> list[RewardPart]:
    """The reflection reward a RewardConfig describes: every registered factory's parts, in registry order.

    `data_dir`: the stage's reflection data (rewards that play a row's next session read it); `shared`: scorers
    already built, by the name factories share them under (`judge`: a JudgedScorer)."""
    factories = [entry.build for entry in REWARDS.values() if entry.build is not None]
    if cfg.outcome is not None and not any("outcome" in e.parts for e in REWARDS.values() if e.build is not None):
        # the next-session reward plays an environment: it registers from above this layer, when imported
        raise ConfigError(
            "reward.outcome is set but the next-session reward is not registered: import memrl.train.rewards"
        )
    ctx = PartContext(cfg, data_dir, shared)
    return [part for build in factories for part in build(ctx)]


register(
    RewardEntry(
        "coverage",
        ("coverage",),
        "ground truth preferences (the session's enforcements, gold notes) and a judge (offline MiniLM or an LLM)",
        build_judge,
        "how much of the user's preferences the reflection's notes hold (judge 0-3 / 3)",
        coverage_parts,
    )
)
register(
    RewardEntry(
        "format",
        ("format",),
        "the reply text",
        format_reward,
        "does the reply keep the reflection's JSON contract (credit 0 to 1)",
        format_parts,
    )
)
register(
    RewardEntry(
        "length",
        ("length_penalty",),
        "the reply text and reward.length_penalty",
        length_penalty,
        "minus a penalty per token over the notes' budget",
        length_parts,
    )
)
