"""The next-session outcome reward of a reflection: what its notes do for the user's next session, its scorer, and
its part of the reflection reward (`outcome`, weighted by reward.outcome.weight: `outcome_parts`).

For one (notes, row), the row's next session (memrl.envs.collab.next_session: its user, problem and grading) is
played with the rule user for `max_turns` replies, once with the notes in the agent's system prompt and once with
none (the counterfactual baseline). The reward is the session's share of preferences met with the notes minus the
share without, in [-1, 1].

Sessions are cached by (row, sha256 of the notes) (the baseline is the entry of the empty notes) and played in lock
step: each round sends every live session's next reply to the agent in one batch (one `generate` call of the
agent's backend). A session that fails (its agent or user raised) gives None, never 0, and is not cached. With
`workers` or `ray_address` set the sessions are played on Ray actors (`next_session_actors`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from memrl.core.errors import ConfigError
from memrl.envs.collab.grading import Grader
from memrl.envs.collab.next_session import (
    LLMPreferenceJudge,
    ModelAgent,
    NextSessionRow,
    NoteAgent,
    PreferenceJudge,
    SessionOutcome,
    load_rows,
    next_problem,
    session_share,
)
from memrl.envs.collab.problems import Problem, load_problems
from memrl.envs.collab.scripted_reader import ScriptedReader
from memrl.envs.collab.session import CollabEpisode, SessionSpec
from memrl.envs.collab.user_sim import RuleUserSimulator
from memrl.rewards.config import NextSessionRewardConfig
from memrl.rewards.format import extract_notes
from memrl.rewards.parts import PartContext, RewardPart, Sample, Scored
from memrl.rollout.base import ChatBackend, Message

log = logging.getLogger(__name__)
FAILED_METRIC = "reward/outcome_failed"


@dataclass(frozen=True)
class OutcomeParts:
    """The reward of one (notes, row) and what it is made of; `score` None: a session failed (see `error`)."""

    score: float | None
    with_notes: float | None
    without_notes: float | None
    effort_with: int | None = None
    effort_without: int | None = None
    error: str = ""

    @property
    def failed(self) -> bool:
        return self.score is None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"failed": self.failed}


def notes_hash(notes: str) -> str:
    return hashlib.sha256(notes.strip().encode()).hexdigest()


class NextSessionScorer:
    """Scores (notes, row) pairs by their next session; build once per process and reuse (it caches sessions)."""

    def __init__(
        self,
        agent: NoteAgent,
        *,
        max_turns: int = 2,
        seed: int = 0,
        problems: Path | None = None,
        judge: PreferenceJudge | None = None,
        cache_size: int = 65536,
        backends: Sequence[ChatBackend] = (),
    ) -> None:
        self.agent = agent
        self._backends = list(backends)  # what `close` releases
        self.max_turns = max_turns
        self.seed = seed
        self.problems_source = problems
        self.judge = judge
        self.grader = Grader()
        self.simulator = RuleUserSimulator(self.grader, seed=seed)
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[str, str], SessionOutcome] = OrderedDict()
        self._problems: dict[str, list[Problem]] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.sessions = 0  # sessions played (cache misses that finished)
        self.failures = 0

    def _problem(self, row: NextSessionRow) -> Problem:
        if row.task not in self._problems:
            self._problems[row.task] = load_problems(row.task, self.problems_source, seed=self.seed)
        return next_problem(row, self._problems[row.task], self.seed)

    def _cached(self, key: tuple[str, str]) -> SessionOutcome | None:
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                self.hits += 1
            return hit

    def _store(self, key: tuple[str, str], outcome: SessionOutcome) -> None:
        if self.cache_size <= 0:
            return
        with self._lock:
            self._cache[key] = outcome
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    async def ascore(self, items: Sequence[tuple[str, NextSessionRow]]) -> list[OutcomeParts]:
        """One OutcomeParts per (notes, row), in order; every session not cached is played in one lock-step batch."""
        wanted = {(row.key, notes_hash(n)): (n.strip(), row) for notes, row in items for n in (notes, "")}
        known: dict[tuple[str, str], SessionOutcome | BaseException] = {}
        todo = []
        for key, job in wanted.items():
            hit = self._cached(key)
            if hit is None:
                todo.append((key, job))
            else:
                known[key] = hit
        played = await self.play([job for _, job in todo])
        for (key, _), outcome in zip(todo, played, strict=True):
            known[key] = outcome
            if isinstance(outcome, SessionOutcome):
                self._store(key, outcome)
        parts = [
            self._parts(known[(row.key, notes_hash(notes))], known[(row.key, notes_hash(""))]) for notes, row in items
        ]
        with self._lock:
            self.sessions += sum(isinstance(o, SessionOutcome) for o in played)
            self.failures += sum(p.failed for p in parts)
        if failed := [p for p in parts if p.failed]:
            log.warning(
                "outcome reward: %d of %d samples have no reward, e.g. %s", len(failed), len(parts), failed[0].error
            )
        return parts

    @staticmethod
    def _parts(with_notes: SessionOutcome | BaseException, without: SessionOutcome | BaseException) -> OutcomeParts:
        for outcome in (with_notes, without):
            if isinstance(outcome, BaseException):
                return OutcomeParts(None, None, None, error=f"{type(outcome).__name__}: {outcome}")
        assert isinstance(with_notes, SessionOutcome) and isinstance(without, SessionOutcome)
        score = round(with_notes.share - without.share, 6)
        return OutcomeParts(score, with_notes.share, without.share, with_notes.user_effort, without.user_effort)

    async def play(self, jobs: Sequence[tuple[str, NextSessionRow]]) -> list[SessionOutcome | BaseException]:
        """Play the next session of each (notes, row) in lock step; an exception stands for a failed session."""
        results: list[SessionOutcome | BaseException | None] = [None] * len(jobs)
        episodes: list[CollabEpisode | None] = []
        for n, (_, row) in enumerate(jobs):
            try:
                spec = SessionSpec(row.profile(), self._problem(row), row.session + 1)
                episodes.append(CollabEpisode(spec, self.simulator, self.grader, self.max_turns))
            except Exception as exc:  # a row whose user or problem cannot be built: that sample has no reward
                results[n] = exc
                episodes.append(None)
        observations: dict[int, list[Message]] = {}

        async def reset(n: int, episode: CollabEpisode) -> None:
            try:
                observations[n] = await episode.reset()
            except Exception as exc:
                results[n] = exc

        await asyncio.gather(*(reset(n, e) for n, e in enumerate(episodes) if e is not None))
        while live := sorted(observations):
            try:
                texts = await self.agent.replies([(jobs[n][0], observations[n]) for n in live])
            except Exception as exc:  # the agent's model failed for the whole batch
                for n in live:
                    results[n] = exc
                break
            await asyncio.gather(
                *(self._step(n, episodes[n], text, observations, results) for n, text in zip(live, texts, strict=True))
            )
        for n, episode in enumerate(episodes):
            if results[n] is None and episode is not None:
                played = episode.outcome()
                share = await session_share(played.turns, episode.spec.profile, self.judge)
                results[n] = SessionOutcome(share, len(played.turns) // 2, played.user_effort, played.task_success)
        return [r if r is not None else RuntimeError("session never finished") for r in results]

    @staticmethod
    async def _step(
        n: int,
        episode: CollabEpisode | None,
        text: str,
        observations: dict[int, list[Message]],
        results: list[SessionOutcome | BaseException | None],
    ) -> None:
        assert episode is not None
        try:
            step = await episode.step(text)
        except Exception as exc:
            results[n] = exc
            del observations[n]
            return
        if step.done:
            del observations[n]
        else:
            observations[n] = step.observation

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"sessions": self.sessions, "cache_hits": self.hits, "failures": self.failures}

    def close(self) -> None:
        for backend in self._backends:
            backend.close()


def build_scorer(cfg: NextSessionRewardConfig) -> NextSessionScorer:
    """The scorer a recipe's `reward.outcome` describes (Ray actors when `workers` or `ray_address` is set)."""
    from memrl.rollout.builder import build_backend

    if cfg.workers or cfg.ray_address:
        from memrl.train.rewards.next_session_actors import ActorScorer

        return ActorScorer(cfg)
    backends: list[ChatBackend] = []
    agent: NoteAgent
    if isinstance(cfg.agent, str):
        agent = ScriptedReader()
    else:
        backends.append(build_backend(cfg.agent))
        agent = ModelAgent(backends[0], cfg.sampling.params(), name=cfg.agent.model, reply=cfg.reply)
    judge = None
    if cfg.judge is not None:
        backends.append(build_backend(cfg.judge))
        judge = LLMPreferenceJudge(backends[-1])
    return NextSessionScorer(
        agent,
        max_turns=cfg.max_turns,
        seed=cfg.seed,
        problems=cfg.problems,
        judge=judge,
        cache_size=cfg.cache_size,
        backends=backends,
    )


class OutcomeScorer:
    """Plays each sample's notes (the reflection JSON's `agent_notes`; none: "") in its row's next session."""

    def __init__(self, scorer: NextSessionScorer, rows: Mapping[str, NextSessionRow]) -> None:
        self.scorer = scorer
        self.rows = rows

    async def ascore(self, samples: Sequence[Sample]) -> list[Scored]:
        if missing := [s.key for s in samples if s.key not in self.rows]:
            raise ConfigError(
                f"outcome reward: row {missing[0]!r} is not in the reflection data it was built from "
                "(the row's key: TRL's dataset `key` column, verl's extra_info.key)"
            )
        notes = [extract_notes(s.completion) or "" for s in samples]
        parts = await self.scorer.ascore([(n, self.rows[str(s.key)]) for n, s in zip(notes, samples, strict=True)])
        return [
            Scored(
                {"outcome": p.score},
                {
                    "outcome": p.score,
                    "outcome_with_notes": p.with_notes,
                    "outcome_without_notes": p.without_notes,
                    "outcome_failed": float(p.failed),
                },
            )
            for p in parts
        ]

    def batch_metrics(self, scored: Sequence[Scored]) -> dict[str, float]:
        return {FAILED_METRIC: sum(s.logged["outcome_failed"] or 0.0 for s in scored)}


def outcome_parts(ctx: PartContext) -> list[RewardPart]:
    """`outcome` where reward.outcome is set: its rows from `outcome.data`, else the stage's data."""
    cfg = ctx.cfg.outcome
    if cfg is None:
        return []
    data = cfg.data or ctx.data_dir
    if data is None:
        raise ConfigError("reward.outcome.data must name the reflection_data folder")
    scorer = ctx.shared("outcome", lambda: OutcomeScorer(build_scorer(cfg), load_rows(data)))
    return [RewardPart("outcome", cfg.weight, scorer)]
