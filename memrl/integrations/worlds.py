"""memrl's worlds by name, as an outside trainer plays them: a config per world and a fresh episode per seed.

A `World` builds one `Episode` (memrl.envs.episode) per seed: every draw the world makes comes from that seed (the
collab user and its problems, the MS-TOD session, the PAHF task, the simulated user's phrasing or an LLM user's
sampling), so one seed and one list of replies play one episode. The episodes are the worlds' own
(`CollabEpisode`, `MultiSessionEpisode`, `ProactiveEpisode`, `PahfEpisode`); nothing here steps a user. `reward`
turns a finished episode (its record and last reward parts) into the one number a trainer's interface carries.

The configs are the flags of `memrl world serve WORLD` and the keyword arguments of
`memrl.integrations.verifiers.load_environment(world=...)`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import Field

from memrl.core.errors import ConfigError
from memrl.core.schema import StrictModel
from memrl.envs.episode import Episode
from memrl.rewards.collab_episode import EpisodeRewardWeights, episode_parts
from memrl.rollout.base import ChatBackend, SamplingParams
from memrl.rollout.config import ModelConfig

WorldName = Literal["collab", "tod", "pahf"]
SEEDS = 2**31  # a seed the server draws when a reset names none


class World(Protocol):
    name: str

    def episode(self, seed: int, **options: Any) -> Episode: ...

    def reward(self, record: Mapping[str, Any], parts: Mapping[str, float]) -> float: ...

    def close(self) -> None: ...


def _no_options(world: str, unknown: Mapping[str, Any]) -> None:
    if unknown:
        raise ValueError(f"world {world}: an episode takes no option {', '.join(sorted(unknown))}")


# --- collab -------------------------------------------------------------------------------------------------------


class CollabWorldConfig(StrictModel):
    """MultiSessionCollab: a user with three preferences, problems of a task, the rule or an LLM user."""

    task: str = Field(default="arith", description="problem task (arith needs no data; others need --problems)")
    problems: Path | None = Field(default=None, description="a local problem file or folder of the task")
    sessions: int = Field(default=1, ge=1, le=50, description="sessions per episode; the notes carry between them")
    reflector: Literal["policy", "oracle", "empty"] = Field(
        default="policy", description="who writes the notes between sessions: policy | oracle | empty"
    )
    user: Literal["rule", "llm"] = Field(default="rule", description="the simulated user: rule | llm")
    user_model: ModelConfig | None = Field(default=None, description="the LLM user's model (with --user llm)")
    max_turns: int = Field(default=10, ge=1, le=100, description="agent replies per session")
    reply_tokens: int = Field(default=256, ge=1, description="the reply budget the agent prompt states")


class CollabWorld:
    name = "collab"

    def __init__(self, cfg: CollabWorldConfig) -> None:
        from memrl.envs.collab.grading import Grader
        from memrl.envs.collab.problems import load_problems

        if cfg.user == "llm" and cfg.user_model is None:
            raise ConfigError("collab: --user llm needs --user-model NAME@URL")
        self.cfg = cfg
        self.grader = Grader()
        self.problems = load_problems(cfg.task, cfg.problems)
        if len(self.problems) < cfg.sessions:
            raise ConfigError(f"collab: task {cfg.task!r} has {len(self.problems)} problems, fewer than {cfg.sessions}")
        self._backend: ChatBackend | None = None
        if cfg.user_model is not None and cfg.user == "llm":
            from memrl.rollout.builder import build_backend

            self._backend = build_backend(cfg.user_model)
        self.weights = EpisodeRewardWeights()

    def episode(self, seed: int, *, reflector: str | None = None, **unknown: Any) -> Episode:
        """`reflector` (policy | oracle | empty) overrides the config's for this episode (several sessions)."""
        from memrl.envs.collab.multi_session import REFLECTORS, MultiSessionEpisode
        from memrl.envs.collab.profiles import sample_profiles
        from memrl.envs.collab.session import CollabEpisode, SessionSpec
        from memrl.envs.collab.user_sim import LLMUserSimulator, RuleUserSimulator, UserSimulator

        _no_options(self.name, unknown)
        if reflector is not None and reflector not in REFLECTORS:
            raise ValueError(f"reflector must be one of {', '.join(REFLECTORS)}, not {reflector!r}")
        profile = sample_profiles(1, seed)[0]
        problems = random.Random(seed).sample(self.problems, self.cfg.sessions)
        specs = [SessionSpec(profile, problem, i) for i, problem in enumerate(problems)]
        simulator: UserSimulator = (
            RuleUserSimulator(self.grader, seed)
            if self._backend is None
            else LLMUserSimulator(self._backend, SamplingParams(temperature=1.0, max_tokens=512, seed=seed))
        )
        if self.cfg.sessions == 1:
            return CollabEpisode(specs[0], simulator, self.grader, self.cfg.max_turns)
        return MultiSessionEpisode(
            specs,
            simulator,
            self.grader,
            reflector=reflector or self.cfg.reflector,
            max_turns=self.cfg.max_turns,
            reply_tokens=self.cfg.reply_tokens,
        )

    def reward(self, record: Mapping[str, Any], parts: Mapping[str, float]) -> float:
        """One session: the collab GRPO reward (`EpisodeRewardWeights.total` of its parts); several: the share of
        preferences met in the sessions after the first."""
        if self.cfg.sessions > 1:
            return parts["preference"]
        return self.weights.total(episode_parts(record))

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()


# --- MS-TOD -------------------------------------------------------------------------------------------------------


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
        _no_options(self.name, unknown)
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


# --- PAHF ---------------------------------------------------------------------------------------------------------


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
        _no_options(self.name, unknown)
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


# --- the agent's side ---------------------------------------------------------------------------------------------

_TOD_SYSTEM = (
    "You are a booking assistant. Confirm the user's request: state every detail of it (place, date, time, party "
    "size and the like) in one reply, and fix what the user says you missed."
)
_PAHF_SYSTEM = (
    "You shop for the user. Either ask one question as `ASK: <question>` or answer with the letter of the option "
    "to buy."
)


def system_prompt(world: str, reply_tokens: int = 256) -> str:
    """A system prompt for an agent that plays world `world` from outside (the observations of one collab session,
    TOD and PAHF carry none): collab's is memrl's own agent prompt (no notes, replies in text)."""
    if world == "collab":
        from memrl.envs.collab.prompts import agent_messages

        return agent_messages("none", "", [], reply_tokens, "text")[0]["content"]
    return _TOD_SYSTEM if world == "tod" else _PAHF_SYSTEM


# --- by name ------------------------------------------------------------------------------------------------------

CONFIGS: dict[str, type[StrictModel]] = {
    "collab": CollabWorldConfig,
    "tod": TodWorldConfig,
    "pahf": PahfWorldConfig,
}
_BUILDERS: dict[str, Callable[[Any], World]] = {"collab": CollabWorld, "tod": TodWorld, "pahf": PahfWorld}


def world_config(name: str) -> type[StrictModel]:
    """The config model of world `name`; one line naming the worlds otherwise."""
    if name not in CONFIGS:
        raise ConfigError(f"unknown world {name!r} (worlds: {', '.join(CONFIGS)})")
    return CONFIGS[name]


def build_world(name: str, config: StrictModel | Mapping[str, Any] | None = None) -> World:
    """World `name` built from its config (a model, or its fields as a mapping, validated in one line)."""
    model = world_config(name)
    if not isinstance(config, model):
        from pydantic import ValidationError

        from memrl.core.schema import describe_error

        try:
            config = model.model_validate(dict(config or {}))
        except ValidationError as exc:
            raise ConfigError(f"world {name}: {describe_error(exc, model)}") from None
    return _BUILDERS[name](config)
