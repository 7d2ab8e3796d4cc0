"""Play a batch of episodes with the policy as one token sequence each: what a multi-turn GRPO rollout returns.

Every agent turn of the batch is generated in one call (`Generate`, the trainer's own generation); the
environments then take their steps concurrently on one event loop (an LLM user's requests go out together; with
episodes on Ray actors, `envs/episode_actors.py`, the round is one call per actor). Each
trajectory is `prompt_ids` (the policy's context and the environment's first observation) and `completion_ids`
(the policy's replies and the environment's turns in between) with `env_mask`: 1 on the tokens the policy sampled,
0 on everything the environment or the template wrote. It stops when the episode is done, when the next reply could
overrun `max_episode_tokens` (status `over_budget`), or when the environment fails (status `failed`, its error
kept); only a `done` trajectory has the episode's record, the outcome the rewards are computed from.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from memrl.envs.online import EpisodeSource, OnlineEpisode
from memrl.train.online.chat_tokens import TurnTokens

log = logging.getLogger(__name__)

# token ids of each context -> (sampled ids of each, their log-probabilities or None)
Generate = Callable[[list[list[int]]], tuple[list[list[int]], list[list[float]] | None]]


def _together(loop: asyncio.AbstractEventLoop, coros: Sequence[Coroutine[Any, Any, None]]) -> None:
    async def gather() -> None:  # gathered inside the loop: outside, gather would bind to another one
        await asyncio.gather(*coros)

    loop.run_until_complete(gather())


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


@dataclass(frozen=True)
class Player:
    source: EpisodeSource
    turns: TurnTokens
    max_turn_tokens: int  # what one generated reply may take (the generation's own cap)
    max_episode_tokens: int  # what all of a trajectory's completion may take

    def play(self, specs: Sequence[str], generate: Generate, loop: asyncio.AbstractEventLoop) -> list[Trajectory]:
        trajectories = [Trajectory(spec) for spec in specs]
        episodes = [self.source(spec) for spec in specs]
        _together(loop, [self._reset(t, e) for t, e in zip(trajectories, episodes, strict=True)])
        while live := [i for i, t in enumerate(trajectories) if t.status == "running"]:
            for i in live:
                if len(trajectories[i].completion_ids) + self.max_turn_tokens + 1 > self.max_episode_tokens:
                    trajectories[i].status = "over_budget"
            live = [i for i in live if trajectories[i].status == "running"]
            if not live:
                break
            contexts = [trajectories[i].prompt_ids + trajectories[i].completion_ids for i in live]
            generated, logprobs = generate(contexts)
            if logprobs is None:
                for t in trajectories:
                    t.logprobs = None
            steps = []
            for n, i in enumerate(live):
                reply, closing = self.turns.close_reply(generated[n])
                trajectories[i].add_reply(reply, bool(closing), None if logprobs is None else logprobs[n][: len(reply)])
                steps.append(self._step(trajectories[i], episodes[i], self.turns.text(reply), closing))
            _together(loop, steps)
        for t in trajectories:
            if not t.completion_ids:  # the environment failed before the policy spoke: nothing to learn from
                t.add([self.turns.end_of_turn], False)
        failed = [t for t in trajectories if t.status == "failed"]
        if failed:
            log.warning(
                "%d of %d episodes failed (no reward), e.g. %s", len(failed), len(trajectories), failed[0].error
            )
        return trajectories

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
        reply, annotations = (text, {}) if isinstance(out := e.read_reply(text), str) else out
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
