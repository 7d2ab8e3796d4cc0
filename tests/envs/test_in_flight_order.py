"""A local run takes its finished calls in the order it made them, not in the order a set of tasks happens to iterate
(memory addresses, which move from run to run): that order decides which requests the next batch holds together, so
a seeded local run writes the same texts again."""

from __future__ import annotations

import asyncio

from memrl.envs.pool import InFlight, LocalPool


class Instant:
    """`run(tag)` finishes at its first step: every call made before `next()` is done by the time it looks."""

    async def run(self, tag: str) -> str:
        await asyncio.sleep(0)
        return tag


def test_calls_that_finish_together_are_taken_in_the_order_they_were_made() -> None:
    in_flight: InFlight[str] = InFlight(LocalPool(Instant, 1), lambda tag: tag)
    try:
        tags = [f"session-{i}" for i in range(64)]
        for tag in tags:
            in_flight.submit(tag, 0, tag)
        taken = [in_flight.next() for _ in tags]
        assert [tag for tag, _ in taken] == tags
        assert all(tag == result for tag, result in taken)
        assert len(in_flight) == 0
    finally:
        in_flight.close()
