"""PAHF shopping served to outside trainers (envs/served.py): `memrl world serve pahf`, verifiers' pahf.

`PahfWorldConfig` is the server's flags; `PahfWorld` draws a scenario of the phase from the seed and plays its
purchase (`PahfEpisode`): the agent may ask the user first, then buys. Its reward is `correct`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field

from memrl.core.errors import ConfigError
from memrl.core.schema import StrictModel
from memrl.envs.episode import Episode
from memrl.envs.served import Served, no_options

SYSTEM = (
    "You shop for the user. Either ask one question as `ASK: <question>` or answer with the letter of the option "
    "to buy."
)


class PahfWorldConfig(StrictModel):
    """PAHF shopping: a purchase for a user whose preference table decides; the agent may ask first."""

    data: Path = Field(description="a PAHF shopping folder (phase1..4.json, persona files)")
    phase: int = Field(default=1, ge=1, le=4, description="the protocol phase (1 and 3 learn from feedback)")


class PahfWorld:
    name = "pahf"

    def __init__(self, cfg: PahfWorldConfig) -> None:
        from memrl.envs.pahf.formats import load_shopping_dir

        self.cfg = cfg
        self.data = load_shopping_dir(cfg.data)
        if not self.data.phases[cfg.phase]:
            raise ConfigError(f"pahf: {cfg.data}: phase {cfg.phase} has no scenario")

    def episode(self, seed: int, **unknown: Any) -> Episode:
        no_options(self.name, unknown)
        from memrl.envs.pahf.agent import PahfEpisode, Task
        from memrl.envs.pahf.protocol import ShoppingUser, shopping_options
        from memrl.envs.pahf.shopping import gold

        phase = self.cfg.phase
        scenario = random.Random(seed).choice(self.data.phases[phase])
        table = self.data.table(phase, scenario.user)
        personas = self.data.personas_original if phase <= 2 else self.data.personas_evolved
        task = Task("shopping", scenario.user, scenario.task, shopping_options(scenario), gold(table, scenario))
        original = self.data.original.get(scenario.user) if phase > 2 else None
        user = ShoppingUser(scenario, table, original, personas.get(scenario.user, ""), "minimal", None)
        return PahfEpisode(task, user, learning=phase in (1, 3))

    def reward(self, record: Mapping[str, Any], parts: Mapping[str, float]) -> float:
        return parts["correct"]

    def close(self) -> None:
        pass


SERVED = Served(
    PahfWorldConfig,
    PahfWorld,
    help="PAHF shopping: a purchase drawn from --data; the agent may ask, then acts.",
    metrics=("correct",),
    system=SYSTEM,
)
