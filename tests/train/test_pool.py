"""The one actor pool (`envs/pool.py`): a call whose actor died runs once more on the restarted actor, after the
replay hook; a second death fails the call in one line; the work's own error is raised as the actor raised it; and
the next-session reward's actors, killed mid-batch, still score the batch."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import local_ray

from memrl.core.errors import MemrlError
from memrl.data_gen.gold import compose_notes
from memrl.envs.collab.next_session import NextSessionRow
from memrl.envs.collab.profiles import sample_profiles
from memrl.envs.pool import ActorDied, ActorPool, InFlight
from memrl.rewards.config import NextSessionRewardConfig
from memrl.rollout.config import HFModelConfig, SamplingConfig
from memrl.train.rewards.next_session import build_scorer
from memrl.train.rewards.next_session_actors import ActorScorer, OutcomeWorker

pytestmark = pytest.mark.slow  # every test here starts Ray actors


@pytest.fixture(scope="module", autouse=True)
def ray_up() -> Iterator[None]:
    import ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # actors need not import the tests folder
    env = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    with local_ray(num_cpus=2, runtime_env={"env_vars": env}):  # loopback only, with a token, as memrl's own
        yield


class Sleeper:
    """`run(x)` marks that it started (a file in `marks`), sleeps `x` seconds and answers its pid; x < 0 raises."""

    def __init__(self, marks: str) -> None:
        self.marks = Path(marks)

    def run(self, x: float) -> int:
        (self.marks / f"{os.getpid()}-{time.monotonic_ns()}").touch()
        if x < 0:
            raise ValueError("negative sleep")
        time.sleep(x)
        return os.getpid()


def started(marks: Path, n: int) -> None:
    """Wait until `n` calls have started in the actors."""
    deadline = time.monotonic() + 120
    while len(list(marks.iterdir())) < n:
        assert time.monotonic() < deadline, "the calls never started"
        time.sleep(0.05)


def kill(pool: ActorPool, actor: int) -> None:
    """Kill an actor as the OOM killer would: Ray restarts it."""
    import ray

    ray.kill(pool.actors[actor], no_restart=False)


def test_a_call_whose_actor_died_runs_once_more_after_its_replay(tmp_path: Path) -> None:
    pool = ActorPool(Sleeper, 1, str(tmp_path))
    deaths: list[str] = []
    replays: list[int] = []

    async def replay() -> None:
        replays.append(len(deaths))  # after the death was told, before the call is made again

    async def main() -> int:
        call = asyncio.ensure_future(
            pool.call(0, lambda actor: actor.run.remote(5.0), died=deaths.append, replay=replay)
        )
        await asyncio.to_thread(started, tmp_path, 1)
        first = int(next(tmp_path.iterdir()).name.split("-")[0])
        kill(pool, 0)
        pid = await call
        assert pid != first  # answered by the restarted process
        return pid

    asyncio.run(main())
    assert len(deaths) == 1 and replays == [1]
    assert len(list(tmp_path.iterdir())) == 2  # the call ran twice: before the kill and on the new actor
    pool.close()


def test_a_second_death_fails_the_call_and_the_works_error_is_its_own(tmp_path: Path) -> None:
    pool = ActorPool(Sleeper, 1, str(tmp_path))

    async def main() -> None:
        call = asyncio.ensure_future(pool.call(0, lambda actor: actor.run.remote(5.0)))
        for n in (1, 2):
            await asyncio.to_thread(started, tmp_path, n)
            kill(pool, 0)
        with pytest.raises(ActorDied, match=r"^its worker died 2 times \("):
            await call
        with pytest.raises(ValueError, match="negative sleep"):  # the actor's exception, not Ray's wrapper
            await pool.call(0, lambda actor: actor.run.remote(-1.0))

    asyncio.run(main())
    pool.close()


def test_in_flight_counts_a_retry_and_names_the_work_that_died_twice(tmp_path: Path) -> None:
    lines: list[str] = []
    in_flight: InFlight[str] = InFlight(ActorPool(Sleeper, 2, str(tmp_path)), lambda tag: f"item {tag}", lines.append)
    try:
        in_flight.submit("a", 0, 3.0)
        in_flight.submit("b", 1, 0.0)
        assert in_flight.next()[0] == "b"
        started(tmp_path, 2)
        kill(in_flight.pool, 0)
        tag, _ = in_flight.next()
        assert tag == "a" and in_flight.retried == 1
        assert lines == ["the worker running item a died; running it again on the restarted worker"]
        in_flight.submit("c", 1, -1.0)
        with pytest.raises(MemrlError, match=r"^item c failed: negative sleep$"):
            in_flight.next()
    finally:
        in_flight.close()


# --- the next-session reward on actors ----------------------------------------------------------------------------


class _SlowOutcomeWorker(OutcomeWorker):
    """The reward's actor, marking each call's start in `marks` and taking long enough to be killed under it."""

    def __init__(self, cfg: dict[str, Any], marks: str) -> None:
        super().__init__(cfg)
        self.marks = Path(marks)

    async def play(self, jobs: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any] | str]:
        (self.marks / f"{os.getpid()}-{time.monotonic_ns()}").touch()
        await asyncio.sleep(3.0)
        return await super().play(jobs)


def test_next_session_actors_killed_mid_batch_still_score_it(tiny_qwen2: str, tmp_path: Path) -> None:
    import ray

    agent = HFModelConfig(backend="hf", model=tiny_qwen2)
    cfg = NextSessionRewardConfig(
        agent=agent, sampling=SamplingConfig(temperature=0.0, max_tokens=8, seed=0), max_turns=1, workers=2
    )
    rows = [NextSessionRow(f"{p.id}/s0", p.id, p.preferences, "arith", "none", 0) for p in sample_profiles(4, seed=7)]
    items = [(compose_notes(r.preferences), r) for r in rows]
    reference = asyncio.run(build_scorer(cfg.model_copy(update={"workers": None})).ascore(items))
    scorer = build_scorer(cfg)
    assert isinstance(scorer, ActorScorer)
    pool = scorer.pool = ActorPool(_SlowOutcomeWorker, 2, cfg.model_dump(mode="json"), str(tmp_path))
    ray.get([a.__ray_ready__.remote() for a in pool.actors])

    async def main() -> list[Any]:
        batch = asyncio.ensure_future(scorer.ascore(items))
        await asyncio.to_thread(started, tmp_path, 2)  # both actors are playing their shares
        kill(pool, 0)
        return await batch

    try:
        parts = asyncio.run(main())
    finally:
        scorer.close()
    assert len(list(tmp_path.iterdir())) == 3  # actor 0's share played again on the restarted actor
    assert all(p.score is not None and not p.failed for p in parts), parts
    assert [p.score for p in parts] == [p.score for p in reference]
    assert scorer.stats()["failures"] == 0
