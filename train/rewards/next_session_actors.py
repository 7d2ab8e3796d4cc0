"""The next-session outcome reward with its sessions played on Ray actors (`workers` / `ray_address` set).

The driver's scorer keeps the cache and deals the sessions it must play round-robin over the actors; each actor
holds its own agent model and plays its share in lock step, as the in-process scorer does. An actor that dies under
its share is restarted and plays the share once more (`ActorPool`); a second death fails that share's sessions only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict
from typing import Any

from memrl.envs.collab.next_session import NextSessionRow, SessionOutcome
from memrl.envs.pool import ActorPool
from memrl.envs.ray_start import start_ray
from memrl.rewards.config import NextSessionRewardConfig
from memrl.rollout.base import Message
from memrl.train.rewards.next_session import NextSessionScorer, build_scorer

log = logging.getLogger(__name__)


class OutcomeWorker:
    """A Ray actor: an in-process scorer of its own (its own agent model)."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        local = NextSessionRewardConfig.model_validate(cfg).model_copy(update={"workers": None, "ray_address": None})
        self.scorer = build_scorer(local)

    async def play(self, jobs: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any] | str]:
        rows = [(notes, NextSessionRow(**row)) for notes, row in jobs]
        played = await self.scorer.play(rows)
        return [asdict(o) if isinstance(o, SessionOutcome) else f"{type(o).__name__}: {o}" for o in played]


class _Remote:
    name = "ray-actors"

    async def replies(self, requests: Sequence[tuple[str, list[Message]]]) -> list[str]:
        raise RuntimeError("the actors play the sessions")


class ActorScorer(NextSessionScorer):
    def __init__(self, cfg: NextSessionRewardConfig) -> None:
        super().__init__(_Remote(), max_turns=cfg.max_turns, seed=cfg.seed, cache_size=cfg.cache_size)
        self.cfg = cfg
        self._stack = contextlib.ExitStack()
        self.pool: ActorPool | None = None

    def _spawn(self) -> ActorPool:
        if self.pool is None:
            start_ray(self.cfg.ray_address, self._stack)
            self.pool = ActorPool(OutcomeWorker, self.cfg.workers or 1, self.cfg.model_dump(mode="json"))
        return self.pool

    async def play(self, jobs: Sequence[tuple[str, NextSessionRow]]) -> list[SessionOutcome | BaseException]:
        if not jobs:
            return []
        pool = self._spawn()
        shares = [s for s in (list(range(i, len(jobs), len(pool))) for i in range(len(pool))) if s]
        calls = [
            pool.call(a, self._play([jobs[n] for n in share]), died=self._died(a)) for a, share in enumerate(shares)
        ]
        results = await asyncio.gather(*calls, return_exceptions=True)
        out: list[SessionOutcome | BaseException] = [RuntimeError("not played")] * len(jobs)
        for share, result in zip(shares, results, strict=True):
            for i, n in enumerate(share):
                if isinstance(result, BaseException):
                    out[n] = result
                else:
                    value = result[i]
                    out[n] = SessionOutcome(**value) if isinstance(value, dict) else RuntimeError(value)
        return out

    @staticmethod
    def _play(jobs: list[tuple[str, NextSessionRow]]) -> Callable[[Any], Awaitable[list[dict[str, Any] | str]]]:
        """One actor's call playing `jobs` (the same call again on a restarted actor: it holds no state)."""
        payload = [(notes, asdict(row)) for notes, row in jobs]
        return lambda actor: actor.play.remote(payload)

    @staticmethod
    def _died(actor: int) -> Callable[[str], None]:
        return lambda why: log.warning(
            "outcome actor %d died (%s): playing its sessions again once restarted", actor, why
        )

    def close(self) -> None:
        self._stack.close()
