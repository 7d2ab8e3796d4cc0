"""The offline judge (MiniLM + taxonomy): the orderings the reward must respect, determinism, speed."""

from __future__ import annotations

import asyncio
import time

import pytest

from memrl.core.preferences import TAXONOMY
from memrl.rewards.offline_judge import OfflineJudge
from memrl.rewards.types import GroundTruth, JudgeItem

TRUTH = GroundTruth(("Hold on. Put that in bullet points.", "That doesn't work for me. End with a one-line TL;DR."))
FAITHFUL = (
    "- Format every answer as a bullet list; the user asked for bullets when I wrote paragraphs.\n"
    "- Finish each reply with a one-line TL;DR summary."
)
PARAPHRASED = "The user wants bulleted answers, and a single-line TL;DR at the very end of each reply."
HALF = "- Format every answer as a bullet list; the user asked for bullets when I wrote paragraphs."
ALL_TWENTY = "\n".join(f"- {p.description}" for p in TAXONOMY.values())
IRRELEVANT = "The user worked on a geometry problem about triangles. The final answer was 42. We had a good session."
PADDED = (
    FAITHFUL
    + "\n"
    + "\n".join(
        [
            "The user was solving a maths problem.",
            "The session had several turns.",
            "I answered the question.",
            "The user seemed happy.",
            "We discussed triangles.",
        ]
    )
)
ONE_EXTRA = FAITHFUL + "\n- Keep replies to three sentences at most."


@pytest.fixture(scope="module")
def judge(model_cache: object) -> OfflineJudge:
    return OfflineJudge()


def scores(judge: OfflineJudge, *notes: str, truth: GroundTruth = TRUTH) -> list[float]:
    return [v.score for v in judge.score_many_sync([JudgeItem(n, truth) for n in notes])]


def test_orderings_the_reward_must_respect(judge: OfflineJudge) -> None:
    faithful, paraphrased, half, all_twenty, empty, irrelevant, padded, one_extra = scores(
        judge, FAITHFUL, PARAPHRASED, HALF, ALL_TWENTY, "", IRRELEVANT, PADDED, ONE_EXTRA
    )
    assert faithful == paraphrased == 3.0
    assert faithful > half > all_twenty  # missing one of two sits between faithful and list-everything
    assert half > max(empty, irrelevant)
    assert all_twenty == empty == irrelevant == 0.0
    assert faithful > one_extra > half  # one invented preference costs less than a missing one
    assert faithful > padded > half  # filler statements cost, but less than missing a preference


def test_reasoning_names_what_was_covered_missing_and_invented(judge: OfflineJudge) -> None:
    half, extra = judge.score_many_sync([JudgeItem(HALF, TRUTH), JudgeItem(ONE_EXTRA, TRUTH)])
    assert half.covered == ("bullets",) and half.missing == ("tldr",) and half.hallucinated == ()
    assert "covered 1/2" in half.reasoning and "missing: tldr" in half.reasoning
    assert extra.hallucinated == ("three-sentences",)
    assert "stated but not expected: three-sentences" in extra.reasoning


def test_expected_ids_from_the_data_win_over_the_enforcements(judge: OfflineJudge) -> None:
    kept = GroundTruth(TRUTH.enforcements, expected=("bullets", "tldr", "three-sentences"))  # one kept from before
    with_kept, without = scores(judge, ONE_EXTRA, FAITHFUL, truth=kept)
    assert with_kept == 3.0 and without == 2.0
    nothing_enforced = GroundTruth((), gold_notes="- Use bullet points.\n- End with a TL;DR line.")
    assert scores(judge, FAITHFUL, HALF, truth=nothing_enforced) == [3.0, 1.5]  # falls back to the gold notes


def test_deterministic_alone_or_in_a_batch(judge: OfflineJudge) -> None:
    batch = [JudgeItem(n, TRUTH) for n in (PADDED, FAITHFUL, ONE_EXTRA, HALF, IRRELEVANT)]
    together = judge.score_many_sync(batch)
    alone = [judge.score_many_sync([item])[0] for item in reversed(batch)][::-1]
    fresh = OfflineJudge().score_many_sync(batch)
    assert together == alone == fresh


def test_async_batch_is_fast(judge: OfflineJudge) -> None:
    items = [JudgeItem(f"{FAITHFUL}\n- Variant {i}: keep the TL;DR to one line.", TRUTH) for i in range(64)]
    start = time.perf_counter()
    verdicts = asyncio.run(judge.score_many(items))
    assert len(verdicts) == 64 and all(v is not None and v.score == 3.0 for v in verdicts)
    assert time.perf_counter() - start < 15  # one encoder call for the batch; about 1 s on 2 idle cores
