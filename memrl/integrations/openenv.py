"""A memrl world as an OpenEnv environment server (`memrl world serve WORLD`), built on OpenEnv's own classes.

`WorldEnvironment` is an `openenv.core.env_server.interfaces.Environment` over one world's episodes
(memrl.integrations.worlds). `reset(seed=..., **options)` builds a fresh episode from the seed (the server draws
one when none is given and returns it in the observation; options: collab's `reflector`) and returns its opening.
Each `step(WorldAction)` is one `Episode.step` (the reply and its annotations); the last step carries the reward,
the reward parts and the episode's record. OpenEnv's `create_app` serves it over HTTP and WebSocket (`/ws`: one
environment per client, as OpenEnv's `EnvClient` connects). What the episode refuses (an annotation it does not
take, a step after the last, a step before reset) and a malformed action become one error message for that
client, from OpenEnv's own server; the server and its other clients carry on, and a client that goes away takes
only its own episode with it. `play_remote` is the other side: OpenEnv's client with a memrl model as the agent.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import uuid
from collections.abc import Callable
from typing import Any

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from pydantic import ConfigDict, Field

from memrl.core.errors import ConfigError
from memrl.envs.episode import Episode
from memrl.envs.served import ServedWorld
from memrl.integrations.worlds import SEEDS
from memrl.rollout.serve import client_netloc


class WorldAction(Action):
    """One reply of the agent (in a multi-session reflection: its reflection) and the annotations the world's
    `step` documents (collab: `retrieved`, `parse_failed`, `retrieval_failed`; TOD: `slots`, `parse_failed`).

    The fields take anything and `check` refuses what does not fit in one line of its own (OpenEnv would answer
    "Invalid message" alone)."""

    model_config = ConfigDict(extra="allow")

    reply: Any = Field(default=None, description="the agent's reply (text)", json_schema_extra={"type": "string"})
    annotations: Any = Field(
        default_factory=dict, description="the step's keyword annotations", json_schema_extra={"type": "object"}
    )

    def check(self) -> tuple[str, dict[str, Any]]:
        """(reply, annotations), or a ValueError that says what is wrong with the action."""
        extra = sorted(set(self.model_extra or {}))
        if extra:
            raise ValueError(f"an action has the fields reply and annotations, not {', '.join(extra)}")
        if not isinstance(self.reply, str):
            raise ValueError(f"an action's reply is text, not {type(self.reply).__name__}")
        if not isinstance(self.annotations, dict) or not all(isinstance(k, str) for k in self.annotations):
            raise ValueError(f"an action's annotations are an object, not {type(self.annotations).__name__}")
        return self.reply, self.annotations


class WorldObservation(Observation):
    """The conversation the agent sees next, and on the last step what the episode earned."""

    messages: list[dict[str, Any]] = Field(default_factory=list, description="the messages the policy sees")
    seed: int | None = Field(default=None, description="the episode's seed: the same seed and replies replay it")
    reward_parts: dict[str, float] = Field(default_factory=dict, description="the reward parts this step earned")
    terminated: bool = Field(default=False, description="the world ended the episode (the user, the task)")
    truncated: bool = Field(default=False, description="a limit (the turn limit) cut it short")
    info: dict[str, Any] = Field(default_factory=dict, description="the world's diagnostics for the step")
    record: dict[str, Any] | None = Field(default=None, description="the finished episode's record (last step)")


class WorldState(State):
    world: str = Field(default="", description="the world served")
    seed: int | None = Field(default=None, description="the running episode's seed")
    done: bool = Field(default=False, description="the running episode is over")


def _plain(value: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(value, default=str))
    return out


class WorldEnvironment(Environment[WorldAction, WorldObservation, WorldState]):
    """One client's episodes of a world (the world itself, its grader and model clients, is shared)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, world: ServedWorld) -> None:
        super().__init__()
        self.world = world
        self._episode: Episode | None = None
        self._state = WorldState(world=world.name)

    async def reset_async(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> WorldObservation:
        if seed is None:
            seed = random.SystemRandom().randrange(SEEDS)
        elif isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise ValueError(f"seed must be a whole number from 0 to 2**63-1, not {seed!r}")
        episode = self.world.episode(seed, **kwargs)
        messages = await episode.reset(seed=seed)
        self._episode = episode
        self._state = WorldState(
            episode_id=episode_id or uuid.uuid4().hex, step_count=0, world=self.world.name, seed=seed
        )
        return WorldObservation(messages=list(messages), seed=seed)

    async def step_async(self, action: WorldAction, timeout_s: float | None = None, **kwargs: Any) -> WorldObservation:
        if self._episode is None:
            raise RuntimeError("reset the episode before stepping it")
        if not isinstance(action, WorldAction):
            raise TypeError(f"a step takes a WorldAction, not {type(action).__name__}")
        reply, annotations = action.check()
        step = await self._episode.step(reply, **annotations)
        self._state.step_count += 1
        record, reward = None, None
        if step.done:
            self._state.done = True
            record = _plain(self._episode.record())
            reward = self.world.reward(record, step.reward)
        return WorldObservation(
            messages=list(step.observation),
            seed=self._state.seed,
            done=step.done,
            reward=reward,
            reward_parts=dict(step.reward),
            terminated=step.terminated,
            truncated=step.truncated,
            info=_plain(step.info),
            record=record,
        )

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> WorldObservation:
        return asyncio.run(self.reset_async(seed, episode_id, **kwargs))

    def step(self, action: WorldAction, timeout_s: float | None = None, **kwargs: Any) -> WorldObservation:
        return asyncio.run(self.step_async(action, timeout_s, **kwargs))

    @property
    def state(self) -> WorldState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name=f"memrl-{self.world.name}",
            description=f"memrl's {self.world.name} world: a simulated user, stepped one agent reply at a time",
            version="1",
        )


def world_app(world: ServedWorld, max_clients: int = 8) -> Any:
    """OpenEnv's FastAPI app serving `world`, one environment per connected client (at most `max_clients`)."""
    factory: Callable[[], WorldEnvironment] = lambda: WorldEnvironment(world)  # noqa: E731
    return create_app(
        factory, WorldAction, WorldObservation, env_name=f"memrl-{world.name}", max_concurrent_envs=max_clients
    )


def serve(world: ServedWorld, host: str, port: int, max_clients: int, announce: Callable[[str], None]) -> None:
    """Serve `world` at host:port until stopped (SIGINT/SIGTERM); `announce` gets the URL once it listens."""
    import uvicorn

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.bind((host, port))
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host} port {port}: {exc.strerror or exc}") from None
    config = uvicorn.Config(world_app(world, max_clients), host=host, port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)

    async def run() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started:
            announce(f"http://{client_netloc(host, port)}")
        await task

    try:
        asyncio.run(run())
    finally:
        world.close()


async def play_remote(
    url: str,
    world: str,
    backend: Any,
    sampling: Any,
    seed: int | None,
    show: Callable[[str], None],
    **options: Any,
) -> dict[str, Any]:
    """One episode of the world served at `url`, played by OpenEnv's `GenericEnvClient` with `backend` (a memrl
    `ChatBackend`) as the agent; returns the last observation (reward, parts, record). The agent sees the world's
    system prompt (`worlds.system_prompt`) unless the observation brings its own (several collab sessions)."""
    from openenv.core.generic_client import GenericEnvClient

    from memrl.integrations.worlds import system_prompt

    system = {"role": "system", "content": system_prompt(world, sampling.max_tokens)}
    async with GenericEnvClient(base_url=url) as env:
        result = await env.reset(seed=seed, **options)
        observation = result.observation
        show(f"seed {observation['seed']}")
        shown = 0
        while not result.done:
            messages = observation["messages"]
            for message in messages[shown:]:
                show(f"{message['role']}: {message['content']}")
            prompt = messages if messages and messages[0]["role"] == "system" else [system, *messages]
            plain = [{"role": m["role"], "content": m["content"]} for m in prompt]
            reply = (await backend.achat(plain, sampling)).text
            show(f"agent: {reply}")
            result = await env.step({"reply": reply})
            observation = result.observation
            said = [*plain[len(prompt) - len(messages) :], {"role": "assistant", "content": reply}]
            now = [{"role": m["role"], "content": m["content"]} for m in observation["messages"]]
            shown = len(said) if now[: len(said)] == said else 0  # 0: a new conversation (session, reflection)
        for message in observation["messages"][shown:]:
            show(f"{message['role']}: {message['content']}")
        out: dict[str, Any] = {"reward": result.reward} | {
            k: observation[k] for k in ("seed", "reward_parts", "terminated", "truncated", "record")
        }
        return out
