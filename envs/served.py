"""A world as a trainer outside memrl plays it: its served half (memrl.integrations, docs/integrations.md).

A world's served half (`Served`, one per world: `envs/<world>/served.py`, the `served` of its entry in
`envs/registry.py`) is a config (the flags of `memrl world serve NAME`, the keyword arguments of
`memrl.integrations.verifiers.load_environment(world=NAME)`) and what it builds from one, a `ServedWorld`: one
`Episode` (envs/episode.py) per seed, every draw the world makes coming from that seed (the user and its problems,
the session or the task, the simulated user's phrasing or an LLM user's sampling), so one seed and one list of
replies play one episode. The episodes are the world's own; nothing here steps a user. `reward` turns a finished
episode (its record and last reward parts) into the one number a trainer's interface carries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from memrl.core.schema import StrictModel
from memrl.envs.episode import Episode


class ServedWorld(Protocol):
    """A world built from its served config: a fresh episode per seed, and its reward."""

    name: str

    def episode(self, seed: int, **options: Any) -> Episode: ...

    def reward(self, record: Mapping[str, Any], parts: Mapping[str, float]) -> float: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Served:
    """A world's served half: its config, the world built from one, and what the adapters say about it."""

    config: type[StrictModel]  # the flags of `memrl world serve NAME`, the keywords of verifiers' load_environment
    build: Callable[[Any], ServedWorld]  # a config (an instance of `config`) -> the world
    help: str  # the help line of `memrl world serve NAME`
    metrics: tuple[str, ...]  # the reward parts of an episode's last step (verifiers' metrics)
    # The system prompt of an agent that plays the world from outside, or the function of the reply budget it states.
    system: str | Callable[[int], str]

    def system_prompt(self, reply_tokens: int = 256) -> str:
        """The system prompt of an agent that plays the world from outside, stating `reply_tokens` if it states any."""
        return self.system if isinstance(self.system, str) else self.system(reply_tokens)


def no_options(world: str, unknown: Mapping[str, Any]) -> None:
    """What a served world's `episode` refuses: an option it does not take."""
    if unknown:
        raise ValueError(f"world {world}: an episode takes no option {', '.join(sorted(unknown))}")
