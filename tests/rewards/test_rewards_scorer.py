"""RewardScorer: weighted total and its parts, length penalty, plain-text notes, micro-batching, judge failures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memrl.rewards.config import JudgeConfig, LengthPenaltyConfig, RewardConfig
from memrl.rewards.offline_judge import OfflineJudge
from memrl.rewards.reward import RewardScorer, length_penalty
from memrl.rewards.types import GroundTruth
from memrl.rollout.config import OpenAIModelConfig
from memrl.rollout.serve import free_port

TRUTH = GroundTruth(("Put that in bullet points.", "End with a one-line TL;DR."))
NOTES = "- Format every answer as a bullet list.\n- Finish each reply with a one-line TL;DR summary."
REPLY = json.dumps({"user_preferences_reasoning": "Bullets and a TL;DR were requested.", "agent_notes": NOTES})


@pytest.fixture(scope="module")
def judge(model_cache: object) -> OfflineJudge:
    return OfflineJudge()


def test_total_is_the_weighted_sum_of_its_parts(judge: OfflineJudge) -> None:
    lp = LengthPenaltyConfig(budget=5, per_token=0.01, max_penalty=0.1)
    cfg = RewardConfig(coverage_weight=2.0, format_weight=0.5, length_penalty=lp)
    [parts] = RewardScorer(cfg, judge=judge).score(["```json\n" + REPLY + "\n```"], [TRUTH])
    assert parts.coverage == 1.0 and parts.format == 0.75 and parts.judge_score == 3.0
    assert parts.notes_tokens == 23 and parts.length_penalty == 0.1  # 18 tokens over the budget: capped at 0.1
    assert parts.score == pytest.approx(2.0 * 1.0 + 0.5 * 0.75 - 0.1)
    assert parts.to_dict()["covered"] == ["bullets", "tldr"] and parts.n_hallucinated == 0


def test_length_penalty() -> None:
    cfg = LengthPenaltyConfig(budget=100, per_token=0.002, max_penalty=0.5)
    assert [length_penalty(t, cfg) for t in (50, 100, 150, 10_000)] == [0.0, 0.0, pytest.approx(0.1), 0.5]
    assert length_penalty(10_000, None) == 0.0


def test_plain_notes_are_graded_only_when_asked(judge: OfflineJudge) -> None:
    strict, lenient = (
        RewardScorer(RewardConfig(plain_text_notes=p), judge=judge).score([NOTES], [TRUTH])[0] for p in (False, True)
    )
    assert strict.format == lenient.format == 0.0
    assert strict.coverage == 0.0 and lenient.coverage == 1.0  # training: the agent would store nothing


def test_judge_failure_leaves_the_reward_missing_and_counted(tmp_path: Path) -> None:
    model = OpenAIModelConfig(backend="openai", model="m", endpoint=f"http://127.0.0.1:{free_port()}/v1", max_retries=0)
    scorer = RewardScorer(RewardConfig(judge=JudgeConfig(kind="llm", model=model, cache_dir=str(tmp_path))))
    parts = scorer.score([REPLY, REPLY], [TRUTH, TRUTH])
    assert all(p.judge_failed and p.score is None and p.coverage is None and p.format == 1.0 for p in parts)
    assert scorer.last_batch_failures == 2
    scorer.score([REPLY], [TRUTH])
    assert scorer.stats()["judge_failures"] == 3 and scorer.last_batch_failures == 1


def test_mismatched_lengths_are_refused(judge: OfflineJudge) -> None:
    with pytest.raises(ValueError, match="2 completions but 1 ground truths"):
        RewardScorer(judge=judge).score([REPLY, REPLY], [TRUTH])
