"""Every world by name, in one table: how it is evaluated, whether (and how) a policy trains in it online, and how a
trainer outside memrl plays it.

A `World` holds its evaluation (`eval_config`, the config of `memrl eval NAME` and of stage `eval_NAME`; `run`, the
runner that plays it through the driver, `envs/driver.py`), `online`: either the two halves `envs/online.py`
describes, or the reason the world has no such halves yet, and `served`: its served half (`Served`,
`envs/served.py`: the config of `memrl world serve NAME` and of verifiers' `load_environment(world=NAME)`, and the
world built from it). `Online` is a world's training side: `config`, the `env` of its `<name>_grpo` stage (an
`OnlineConfig`: the rows a policy trains on, and `episodes`, the episode builder that turns a row's spec into a
fresh `Episode`), `reward`, the stage's `reward` (a `PartWeights`: the parts of a finished episode's record, and
their weights), and `view`, how the policy sees a row. `train/online` and the trainer adapters reach a world only
through this table (`online`), as memrl.integrations does (`served`), so a new world is its own modules and one
entry here (docs/online-rl.md, "Adding a world"); `register` also lists an online world's episode reward in `memrl
reward list`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memrl.core.errors import MemrlError
from memrl.core.schema import StrictModel
from memrl.envs.collab.config import CollabEvalConfig
from memrl.envs.collab.rows import CollabRLConfig
from memrl.envs.collab.rows import policy_view as collab_view
from memrl.envs.collab.served import SERVED as COLLAB_SERVED
from memrl.envs.online import OnlineConfig, PolicyView
from memrl.envs.pahf.config import PahfEvalConfig
from memrl.envs.pahf.served import SERVED as PAHF_SERVED
from memrl.envs.served import Served
from memrl.envs.tod.config import TodEvalConfig
from memrl.envs.tod.rows import TodRLConfig
from memrl.envs.tod.rows import policy_view as tod_view
from memrl.envs.tod.served import SERVED as TOD_SERVED
from memrl.rewards.collab_episode import EpisodeRewardWeights
from memrl.rewards.episode import PartWeights
from memrl.rewards.registry import RewardEntry
from memrl.rewards.registry import register as register_reward
from memrl.rewards.tod_episode import TodRewardWeights

if TYPE_CHECKING:
    from pathlib import Path

    from rich.console import Console

    from memrl.envs.driver import DrivenRun


# Each world's runner loads the world's whole machinery (and Ray's): imported when a run starts, so that the CLI
# commands built from this table load only configs.
def _run_collab(cfg: Any, out: Path, console: Console, *more: Any) -> DrivenRun:
    from memrl.envs.collab.runner import collab_run

    return collab_run(cfg, out, console, *more)


def _run_tod(cfg: Any, out: Path, console: Console, *more: Any) -> DrivenRun:
    from memrl.envs.tod.runner import run_tod

    return run_tod(cfg, out, console, *more)


def _run_pahf(cfg: Any, out: Path, console: Console, *more: Any) -> DrivenRun:
    from memrl.envs.pahf.runner import run_pahf

    return run_pahf(cfg, out, console, *more)


@dataclass(frozen=True)
class Online:
    """A world's online half: its stage's `env` and `reward` sections and the policy's view of a row."""

    config: type[OnlineConfig]  # the rows a policy trains on and their episodes (`rows()`, `episodes()`)
    reward: type[PartWeights]  # a finished episode's record -> its reward parts; their weights
    view: Callable[[str, int], PolicyView]  # (spec, the reply budget the prompt states) -> how the policy sees it


@dataclass(frozen=True)
class World:
    name: str
    online: Online | str  # its online half, or why it has none yet
    eval_config: type[StrictModel] | None = None  # `memrl eval NAME` / stage `eval_NAME`; None: no evaluation
    run: Callable[..., DrivenRun] | None = None  # (eval config, output folder, console, ...) -> the driven run
    served: Served | None = None  # how a trainer outside memrl plays it; None: not served


WORLDS: dict[str, World] = {}


def register(entry: World) -> World:
    """Add a world (a name is registered once); one that trains online also registers its episode reward,
    `<name>_episode`, in `memrl reward list`."""
    if entry.name in WORLDS:
        raise ValueError(f"world {entry.name!r} is registered already")
    WORLDS[entry.name] = entry
    if isinstance(entry.online, Online):
        reward = entry.online.reward
        register_reward(
            RewardEntry(
                f"{entry.name}_episode",
                reward.names(),
                f"a finished {entry.name} episode's record (online {entry.name} RL)",
                reward.parts,
                f"the {entry.name} episode's parts, summed with the stage's reward weights",
            )
        )
    return entry


for _world in (
    World(
        "collab",
        Online(CollabRLConfig, EpisodeRewardWeights, collab_view),
        CollabEvalConfig,
        _run_collab,
        COLLAB_SERVED,
    ),
    World("tod", Online(TodRLConfig, TodRewardWeights, tod_view), TodEvalConfig, _run_tod, TOD_SERVED),
    World(
        "pahf",
        "a task's episode is built from a `Job` (`protocol.build_task`), but the policy's prompt needs the agent's "
        "memory summary and the task record its memory writes; there is no row format or policy view yet",
        PahfEvalConfig,
        _run_pahf,
        PAHF_SERVED,
    ),
):
    register(_world)


def evaluation(name: str) -> Callable[..., DrivenRun]:
    """The runner of world `name`'s evaluation (`memrl eval NAME`)."""
    run = world(name).run
    if run is None:
        raise MemrlError(f"world {name!r} has no evaluation")
    return run


def world(name: str) -> World:
    """The registered world `name`; one line naming the worlds otherwise."""
    if name not in WORLDS:
        raise MemrlError(f"unknown world {name!r} (worlds: {', '.join(WORLDS)})")
    return WORLDS[name]


def served_worlds() -> dict[str, Served]:
    """The worlds a trainer outside memrl plays (`memrl world serve NAME`), by name, in table order."""
    return {name: w.served for name, w in WORLDS.items() if w.served is not None}


def online_worlds() -> dict[str, Online]:
    """The worlds a policy trains in online, by name, in table order."""
    return {name: w.online for name, w in WORLDS.items() if isinstance(w.online, Online)}


def online(name: str) -> Online:
    """World `name`'s online half; an error naming the trainable worlds (and why `name` is not one) otherwise."""
    entry = world(name).online
    if isinstance(entry, Online):
        return entry
    trainable = ", ".join(online_worlds())
    raise MemrlError(f"world {name!r} cannot be trained online: {entry} (trainable: {trainable})")


def online_of(config: Any) -> tuple[str, Online]:
    """The world whose online config `config` is (a stage's `env`)."""
    for name, entry in online_worlds().items():
        if isinstance(config, entry.config):
            return name, entry
    raise MemrlError(f"{type(config).__name__} is no registered world's online config")
