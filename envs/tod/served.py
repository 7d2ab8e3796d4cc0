"""MS-TOD served to outside trainers (envs/served.py): `memrl world serve tod`, verifiers' tod.

`TodWorldConfig` is the server's flags; `TodWorld` draws a confirming session of an individual from the seed and
plays its proactive loop (`ProactiveEpisode`) with the rule or an LLM user and supervisor. Its reward is `success`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from memrl.core.errors import ConfigError
from memrl.core.schema import StrictModel
from memrl.envs.episode import Episode
from memrl.envs.served import Served, no_options
from memrl.rollout.base import ChatBackend, SamplingParams
from memrl.rollout.config import ModelConfig

SYSTEM = (
    "You are a booking assistant. Confirm the user's request: state every detail of it (place, date, time, party "
    "size and the like) in one reply, and fix what the user says you missed."
)


class TodWorldConfig(StrictModel):
    """MS-TOD's proactive loop: a confirming session of an individual, the rule or an LLM user and supervisor."""

    data: Path = Field(description="an MS-TOD folder (persona_*.json and schema.json)")
    user: Literal["rule", "llm"] = Field(default="rule", description="the simulated user: rule | llm")
    supervisor: Literal["rule", "llm"] = Field(default="rule", description="who decides what is resolved: rule | llm")
    llm: ModelConfig | None = Field(default=None, description="the LLM user's and supervisor's model")
    max_turns: int = Field(default=10, ge=1, le=100, description="assistant replies per session")


class TodWorld:
    name = "tod"

    def __init__(self, cfg: TodWorldConfig) -> None:
        from memrl.envs.tod.formats import LoadProblems, load_tod_dir
        from memrl.envs.tod.schema import load_schemas

        if "llm" in (cfg.user, cfg.supervisor) and cfg.llm is None:
            raise ConfigError("tod: an llm user or supervisor needs --llm NAME@URL")
        if not (cfg.data / "schema.json").is_file():
            raise ConfigError(f"tod: {cfg.data}: no schema.json (--data takes an MS-TOD folder)")
        self.cfg = cfg
        loaded = load_tod_dir(cfg.data, load_schemas(cfg.data / "schema.json"), LoadProblems())
        self.sessions = [s for individual in loaded for s in individual.sessions if s.scored]
        if not self.sessions:
            raise ConfigError(f"tod: {cfg.data} holds no confirming session to play")
        self._backend: ChatBackend | None = None
        if cfg.llm is not None and "llm" in (cfg.user, cfg.supervisor):
            from memrl.rollout.builder import build_backend

            self._backend = build_backend(cfg.llm)

    def episode(self, seed: int, **unknown: Any) -> Episode:
        no_options(self.name, unknown)
        from memrl.envs.tod.proactive import SUPERVISORS, USERS, ProactiveEpisode

        session = random.Random(seed).choice(self.sessions)
        assert session.confirmation_state is not None
        sampling = SamplingParams(temperature=0.0, max_tokens=256, seed=seed)
        user = USERS[self.cfg.user](self._backend, sampling)
        supervisor = SUPERVISORS[self.cfg.supervisor](self._backend, sampling)
        goal = dict(session.confirmation_state.slot_values)
        return ProactiveEpisode(session.context(), goal, user, supervisor, self.cfg.max_turns)

    def reward(self, record: Mapping[str, Any], parts: Mapping[str, float]) -> float:
        return parts["success"]

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()


SERVED = Served(
    TodWorldConfig,
    TodWorld,
    help="MS-TOD: the proactive confirmation loop of a session drawn from --data.",
    metrics=("success", "dte"),
    system=SYSTEM,
)
