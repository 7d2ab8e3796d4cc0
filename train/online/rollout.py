"""Play a batch of episodes with the policy as one token sequence each: what a multi-turn GRPO rollout returns.

`Player.play_one` is the loop of one episode, the one loop TRL (`play`, each episode of the batch) and verl (its
agent loop, one episode a sample) both run. In `play`, every agent turn of the batch is generated in one call
(`Generate`, the trainer's own generation); the environments then take their steps concurrently on one event loop
(an LLM user's requests go out together; with episodes on Ray actors, `envs/episode_actors.py`, the round is one
call per actor). Each trajectory is `prompt_ids` (the policy's context and the environment's first observation)
and `completion_ids` (the policy's replies and the environment's turns in between) with `env_mask`: 1 on the tokens
the policy sampled, 0 on everything the environment or the template wrote. It stops when the episode is done, when
the next reply could overrun `max_episode_tokens` (status `over_budget`), or when the environment fails (status
`failed`, its error kept); only a `done` trajectory has the episode's record, the outcome the rewards are computed
from.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from memrl.envs.episode import split_reply
from memrl.envs.online import EpisodeSource, OnlineEpisode
from memrl.train.online.chat_tokens import TurnTokens

log = logging.getLogger(__name__)
T = TypeVar("T")

STATUSES = ("done", "failed", "over_budget")  # how a trajectory's episode ended (TRL's `episode_status` extra field)
REPLIES_CUT = "replies_cut"  # the share of an episode's replies cut at the reply budget (its extra field, its metric)

# token ids of each context -> (sampled ids of each, their log-probabilities or None)
Generate = Callable[[list[list[int]]], tuple[list[list[int]], list[list[float]] | None]]
# one episode's context -> (the reply's sampled ids, their log-probabilities or None)
AsyncGenerate = Callable[[list[int]], Awaitable[tuple[list[int], list[float] | None]]]


def _together(loop: asyncio.AbstractEventLoop, tasks: Sequence[asyncio.Task[T]]) -> list[T]:
    async def gather() -> list[T]:  # gathered inside the loop: outside, gather would bind to another one
        return list(await asyncio.gather(*tasks))

    return loop.run_until_complete(gather())


@dataclass
class Trajectory:
    spec: str
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)  # None: the generation gives none
    status: str = "running"  # then done | failed | over_budget
    record: dict[str, Any] | None = None
    error: str | None = None
    replies: int = 0
    cut: int = 0  # replies that hit the reply budget before their end of turn

    @property
    def cut_share(self) -> float | None:
        """The share of the policy's replies cut at the budget (TRL's `clipped_ratio` reads only the last token)."""
        return self.cut / self.replies if self.replies else None

    def add(self, ids: Sequence[int], sampled: bool, logprobs: Sequence[float] | None = None) -> None:
        self.completion_ids += ids
        self.env_mask += [int(sampled)] * len(ids)
        if self.logprobs is not None:  # the environment's tokens get 0.0, as TRL's tool loop gives its tool results
            self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)

    def add_reply(self, ids: Sequence[int], cut: bool, logprobs: Sequence[float] | None = None) -> None:
        """The policy's reply (sampled tokens); `cut`: it hit the reply budget before its end of turn."""
        self.add(ids, True, logprobs)
        self.replies += 1
        self.cut += cut

    def fail(self, exc: BaseException) -> None:
        self.status, self.error = "failed", f"{type(exc).__name__}: {exc}"


class _Rounds:
    """The replies a batch's live episodes ask for (`generate`), answered together by one `Generate` call a round.

    A round is `due` once every episode still playing waits for its reply (or none plays any more); `Player.play`
    then makes the call outside the event loop, as TRL's generation expects, with the contexts in batch order."""

    def __init__(self, loop: asyncio.AbstractEventLoop, playing: int) -> None:
        self.loop = loop
        self.playing = playing
        self.asked: dict[int, tuple[list[int], asyncio.Future[tuple[list[int], list[float] | None]]]] = {}
        self.due: asyncio.Future[None] = loop.create_future()
        self.logprobs = True  # every call gave log-probabilities
        self._check()  # an empty batch is over at once

    def generate(self, n: int) -> AsyncGenerate:
        """Episode `n`'s generation: it waits for its round."""

        async def ask(ids: list[int]) -> tuple[list[int], list[float] | None]:
            reply = self.loop.create_future()
            self.asked[n] = (ids, reply)
            self._check()
            return await reply

        return ask

    def leave(self) -> None:
        """An episode stopped playing."""
        self.playing -= 1
        self._check()

    def _check(self) -> None:
        if len(self.asked) == self.playing and not self.due.done():
            self.due.set_result(None)

    def answer(self, generate: Generate) -> None:
        order = sorted(self.asked)
        generated, logprobs = generate([self.asked[n][0] for n in order])
        self.logprobs &= logprobs is not None
        for i, n in enumerate(order):
            self.asked[n][1].set_result((generated[i], None if logprobs is None else logprobs[i]))
        self.asked, self.due = {}, self.loop.create_future()


@dataclass(frozen=True)
class Player:
    source: EpisodeSource
    turns: TurnTokens
    max_turn_tokens: int  # what one generated reply may take (the generation's own cap)
    max_episode_tokens: int  # what all of a trajectory's completion may take

    def play(self, specs: Sequence[str], generate: Generate, loop: asyncio.AbstractEventLoop) -> list[Trajectory]:
        """Play `specs` on `loop`, each episode as `play_one` plays it, every round's replies in one `generate`."""
        rounds = _Rounds(loop, len(specs))

        async def one(n: int, spec: str) -> Trajectory:
            try:
                return await self.play_one(spec, rounds.generate(n))
            finally:
                rounds.leave()

        playing = [loop.create_task(one(n, spec)) for n, spec in enumerate(specs)]  # dealt to sources in order
        try:
            while True:
                loop.run_until_complete(rounds.due)
                if not rounds.asked:  # every episode is over
                    break
                rounds.answer(generate)
        except BaseException:  # the generation failed: no episode waits for it on the loop, which lives on
            for task in playing:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*playing, return_exceptions=True))
            raise
        trajectories = _together(loop, playing)
        if not rounds.logprobs:  # a generation without log-probabilities: the batch has none
            for t in trajectories:
                t.logprobs = None
        failed = [t for t in trajectories if t.status == "failed"]
        if failed:
            log.warning(
                "%d of %d episodes failed (no reward), e.g. %s", len(failed), len(trajectories), failed[0].error
            )
        return trajectories

    async def play_one(
        self, spec: str, generate: AsyncGenerate, cap: Callable[[list[int]], list[int]] | None = None
    ) -> Trajectory:
        """One episode of `spec`: reset, then the policy's replies (`generate`) and the environment's steps until it
        is done, the next reply could overrun the budget, or the environment fails; `cap` fits the opening to a
        prompt budget."""
        t, episode = Trajectory(spec), self.source(spec)
        await self._reset(t, episode)
        if cap is not None:
            t.prompt_ids = cap(t.prompt_ids)
        while t.status == "running":
            if len(t.completion_ids) + self.max_turn_tokens + 1 > self.max_episode_tokens:
                t.status = "over_budget"
                break
            ids, logprobs = await generate(t.prompt_ids + t.completion_ids)
            if logprobs is None:
                t.logprobs = None
            reply, closing = self.turns.close_reply(ids)
            t.add_reply(reply, bool(closing), None if logprobs is None else logprobs[: len(reply)])
            await self._step(t, episode, self.turns.text(reply), closing)
        if not t.completion_ids:  # the environment failed before the policy spoke: nothing to learn from
            t.add([self.turns.end_of_turn], False)
        return t

    async def _reset(self, t: Trajectory, e: OnlineEpisode) -> None:
        try:
            observation = await e.episode.reset()
        except Exception as exc:  # a user simulator that cannot start: counted, the sample is excluded
            t.fail(exc)
            t.prompt_ids = self.turns.prompt(e.context)
            return
        t.prompt_ids = self.turns.prompt([*e.context, *observation])

    async def _step(self, t: Trajectory, e: OnlineEpisode, text: str, closing: list[int]) -> None:
        """Step the episode with the reply; unless it is over, append the user's turn (after `closing`, the end of
        turn a reply cut at its budget lacks: a last reply stays cut, as TRL's clipped completions are)."""
        reply, annotations = split_reply(e.read_reply(text))
        try:
            step = await e.episode.step(reply, **annotations)
            if step.done:
                t.status, t.record = "done", e.episode.record()
                return
        except Exception as exc:  # a user simulator failing mid-episode: counted, the sample is excluded
            t.fail(exc)
            return
        said = step.observation[-1]
        if said["role"] != "user":
            raise RuntimeError(f"an episode went on after the agent without a user turn: {said['role']}")
        t.add(closing + self.turns.user_turn(said["content"]), False)
