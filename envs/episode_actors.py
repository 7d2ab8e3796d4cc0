"""Episodes stepped on Ray actors: the environment's turns of a batch run where its user simulators live.

`ActorEpisodes` is an `EpisodeSource` like an in-process one: each `OnlineEpisode` has the trainer-side half
(`PolicyView`: context and `read_reply`, built on the driver) and a `RemoteEpisode` whose `reset` / `step` are
calls on one of the `EpisodeWorker` actors. Episodes are dealt round-robin over the actors; every call a round
makes on one event loop is gathered (`MicroBatcher`) into ONE call per actor carrying all that actor's episodes,
which the actor runs concurrently on its own event loop (an LLM user's requests go out together).

Faults. An environment that raises fails only its episode (its error comes back as a string). An actor that dies
(killed, OOM) is restarted by Ray (`ActorPool`); each of its live episodes is then replayed once on the restarted
actor (the pool's replay hook): reset (with the seed it was given) and stepped again with the replies already given,
each observation checked against the recorded one (the rule user is deterministic per seed; a sampling LLM user is
not, and such an episode fails saying so), before the interrupted call is made again. Replays are counted and
logged. A second death of the same episode fails it (`EnvActorDied`), never the batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import weakref
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from memrl.core.asyncs import MicroBatcher
from memrl.envs.episode import Episode, Step
from memrl.envs.online import Episodes, OnlineEpisode, ViewSource
from memrl.envs.pool import ActorDied, ActorLost, ActorPool
from memrl.envs.ray_start import start_ray
from memrl.rollout.base import Message

log = logging.getLogger(__name__)

# What an actor answers per episode: the step as plain data, the environment's error, or None: the actor does not
# hold the episode (it restarted since the episode was reset there).
Outcome = dict[str, Any] | str | None
# A step's TypeError (an annotation the environment does not take) comes back as {MISUSE: error}; the episode stays
# live and the driver raises TypeError, as an in-process episode does (the protocol, envs/checker.py).
MISUSE = "misuse"


class EnvActorDied(RuntimeError):
    """The actor of an episode died twice while playing it: the episode fails."""


class RemoteEnvError(RuntimeError):
    """The environment raised on its actor (a user simulator's failure): the episode fails."""


class ReplayDiverged(RuntimeError):
    """A replayed episode did not repeat what it had said: the environment is not deterministic."""


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class EpisodeWorker:
    """A Ray actor holding live episodes by id; each batched call runs its episodes concurrently on its event loop."""

    def __init__(self, factory: Callable[..., Episodes], *args: Any) -> None:
        self.episodes = factory(*args)
        self.live: dict[int, Episode] = {}

    def _drop(self, keys: Sequence[int]) -> None:
        for key in keys:  # episodes the driver let go of without finishing (over budget)
            self.live.pop(key, None)

    async def reset(self, jobs: list[tuple[int, str, int | None]], drop: list[int]) -> list[Outcome]:
        self._drop(drop)

        async def one(key: int, spec: str, seed: int | None) -> Outcome:
            try:
                episode = self.live[key] = self.episodes.episode(spec)
                return {"observation": await episode.reset(seed=seed)}
            except Exception as exc:  # that episode's failure, never the batch's
                self.live.pop(key, None)
                return _error(exc)

        return list(await asyncio.gather(*(one(*job) for job in jobs)))

    async def step(self, jobs: list[tuple[int, str, dict[str, Any]]], drop: list[int]) -> list[Outcome]:
        self._drop(drop)

        async def one(key: int, reply: str, annotations: dict[str, Any]) -> Outcome:
            episode = self.live.get(key)
            if episode is None:
                return None
            try:
                step = await episode.step(reply, **annotations)
                out: dict[str, Any] = {"observation": step.observation, "reward": step.reward, "info": step.info}
                out |= {"terminated": step.terminated, "truncated": step.truncated}
                if step.done:
                    out["record"] = episode.record()
                    del self.live[key]
                return out
            except TypeError as exc:  # the caller's misuse (an annotation it does not take): the episode lives on
                return {MISUSE: _error(exc)}
            except Exception as exc:
                del self.live[key]
                return _error(exc)

        return list(await asyncio.gather(*(one(*job) for job in jobs)))

    def close(self) -> None:
        self.episodes.close()


def _label(key: int, spec: str) -> str:
    with contextlib.suppress(ValueError, AttributeError):
        if name := json.loads(spec).get("key"):
            return f"episode {key} ({name})"
    return f"episode {key}"


class RemoteEpisode:
    """The driver's handle on an episode living on an actor: the `Episode` protocol, each call batched with the
    round's others. It keeps the replies given and the observations seen, to replay the episode once if its actor
    dies."""

    def __init__(self, source: ActorEpisodes, key: int, spec: str, actor: int) -> None:
        self.source = source
        self.key = key
        self.spec = spec
        self.actor = actor
        self.name = _label(key, spec)
        self.deaths = 0
        self._seed: int | None = None
        self._opening: list[Message] | None = None
        self._steps: list[tuple[str, dict[str, Any], list[Message]]] = []  # reply, annotations, what came back
        self._record: dict[str, Any] | None = None

    async def reset(self, *, seed: int | None = None) -> list[Message]:
        self._opening, self._steps, self._record, self._seed = None, [], None, seed
        self._opening = (await self._call("reset", (self.spec, seed)))["observation"]
        return list(self._opening)

    async def step(self, reply: str, **annotations: Any) -> Step:
        if self._opening is None:
            raise RuntimeError("reset the episode before stepping it")
        if self._record is not None:
            raise RuntimeError("the episode is over: reset it to start again")
        out = await self._call("step", (reply, annotations))
        self._steps.append((reply, annotations, out["observation"]))
        step = Step(list(out["observation"]), out["reward"], out["terminated"], out["truncated"], out["info"])
        if step.done:
            self._record = out["record"]
        return step

    def record(self) -> dict[str, Any]:
        if self._record is None:
            raise RuntimeError("the episode has no record before its last step")
        return self._record

    async def _call(self, method: str, payload: tuple[Any, ...]) -> dict[str, Any]:
        replay = self._replay if method == "step" else None  # a reset is made again as it was
        try:
            return await self.source.pool.call(
                self.actor, lambda _: self._attempt(method, payload), died=self._died, replay=replay
            )
        except ActorDied as exc:  # died again under the same call: the episode's second death at least
            self._died(exc.why)
            raise

    async def _attempt(self, method: str, payload: tuple[Any, ...]) -> dict[str, Any]:
        out = await self.source.submit(method, self, payload)
        if isinstance(out, dict) and MISUSE in out:
            raise TypeError(out[MISUSE])
        if isinstance(out, dict):
            return out
        if isinstance(out, str):
            raise RemoteEnvError(out)
        if out is None:  # the actor died before the call: it restarted and lost the episode
            raise ActorLost("it restarted without the episode")
        raise out  # Ray's error: the pool tells the actor's death from the work's own error

    def _died(self, why: str) -> None:
        """The episode's own rule, stricter than the pool's: its second death fails it, in whichever call."""
        self.deaths += 1
        if self.deaths > 1:
            raise EnvActorDied(f"env actor {self.actor} died {self.deaths} times while playing {self.name}: {why}")
        self.source.replaying(self, why)

    async def _replay(self) -> None:
        """Play the episode again on the restarted actor up to where it was, checking it says the same."""
        opening = (await self._call("reset", (self.spec, self._seed)))["observation"]
        if opening != self._opening:
            raise ReplayDiverged(f"{self.name} opened differently when replayed: {self._nondeterministic}")
        for n, (reply, given, seen) in enumerate(self._steps, 1):
            out = await self._call("step", (reply, given))
            if out["terminated"] or out["truncated"] or out["observation"] != seen:
                raise ReplayDiverged(
                    f"{self.name} answered reply {n} differently when replayed: {self._nondeterministic}"
                )

    _nondeterministic = "its environment is not deterministic (a sampling LLM user?), so a lost actor cannot replay it"


class ActorEpisodes:
    """An `EpisodeSource` whose episodes run on `workers` Ray actors, each building `factory(*args)` (an `Episodes`);
    `view` gives each episode's context and `read_reply` on the driver. Connects to `ray_address` (or starts a local
    Ray) unless Ray is up; `close` ends the actors and a Ray it started.

    `replays` counts episodes replayed after their actor died; `calls` lists every actor call made (method, actor,
    episodes carried)."""

    def __init__(
        self,
        view: ViewSource,
        factory: Callable[..., Episodes],
        args: Sequence[Any],
        workers: int,
        ray_address: str | None = None,
    ) -> None:
        self.view = view
        self.replays = 0
        self.calls: list[tuple[str, int, int]] = []
        self._stack = contextlib.ExitStack()
        try:
            start_ray(ray_address, self._stack)
            self.pool = ActorPool(EpisodeWorker, workers, factory, *args)
        except BaseException:
            self._stack.close()
            raise
        self._dealt = 0
        self._dropped: list[list[int]] = [[] for _ in range(len(self.pool))]
        # wait_s 0: the calls of one round are all made before the loop's next turn, which flushes them together.
        self._batchers = {
            m: MicroBatcher(partial(self._send, m), wait_s=0.0, max_batch=1 << 30) for m in ("reset", "step")
        }

    def __call__(self, spec: str) -> OnlineEpisode:
        actor = self._dealt % len(self.pool)
        episode = RemoteEpisode(self, self._dealt, spec, actor)
        weakref.finalize(episode, self._drop, actor, self._dealt)  # the actor forgets it with the next call
        self._dealt += 1
        view = self.view(spec)
        return OnlineEpisode(episode, view.context, view.read_reply)

    def _drop(self, actor: int, key: int) -> None:
        self._dropped[actor].append(key)

    async def submit(self, method: str, episode: RemoteEpisode, payload: tuple[Any, ...]) -> Outcome | BaseException:
        return await self._batchers[method].submit((episode.actor, episode.key, payload))

    async def _send(
        self, method: str, requests: list[tuple[int, int, tuple[Any, ...]]]
    ) -> list[Outcome | BaseException]:
        """One call per actor with all its requests; an actor's failure is the result of each of its requests."""
        shares: dict[int, list[int]] = {}
        for n, (actor, _, _) in enumerate(requests):
            shares.setdefault(actor, []).append(n)
        refs = []
        for actor, share in shares.items():
            drop, self._dropped[actor] = self._dropped[actor], []
            jobs = [(requests[n][1], *requests[n][2]) for n in share]
            self.calls.append((method, actor, len(share)))
            refs.append(getattr(self.pool.actors[actor], method).remote(jobs, drop))
        answers = await asyncio.gather(*refs, return_exceptions=True)
        out: list[Outcome | BaseException] = [None] * len(requests)
        for share, answer in zip(shares.values(), answers, strict=True):
            for i, n in enumerate(share):
                out[n] = answer if isinstance(answer, BaseException) else answer[i]
        return out

    def replaying(self, episode: RemoteEpisode, why: str) -> None:
        self.replays += 1
        log.warning(
            "env actor %d died (%s): replaying %s once on the restarted actor", episode.actor, why, episode.name
        )

    def close(self) -> None:
        self.pool.close(before="close")  # the actor's own clients (an LLM user's backend)
        self._stack.close()
