"""The LLM judge against a real `transformers serve` (SmolLM2-135M): verdict parsing, retries, cache, concurrency."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from memrl.rewards.config import JudgeConfig, RewardConfig
from memrl.rewards.judge import build_judge
from memrl.rewards.judge_cache import JudgeCache
from memrl.rewards.llm_judge import LLMJudge, judge_messages, parse_verdict
from memrl.rewards.reward import RewardScorer
from memrl.rewards.types import GroundTruth, JudgeItem, JudgeVerdict
from memrl.rollout import SamplingParams
from memrl.rollout.config import OpenAIModelConfig
from memrl.rollout.openai_http import OpenAIBackend
from memrl.rollout.serve import LocalServer, free_port

TRUTH = GroundTruth(("Hold on. Put that in bullet points.", "Wait. End with a one-line TL;DR."), "- Use bullets.")
NOTES = "- Format every answer as a bullet list.\n- Finish each reply with a one-line TL;DR summary."


def judge_for(server: LocalServer, tmp_path: Path | None, max_concurrency: int = 8, **kwargs: object) -> LLMJudge:
    backend = OpenAIBackend(server.name, server.url, max_concurrency=max_concurrency)
    cache = JudgeCache(tmp_path / "verdicts.sqlite") if tmp_path else None
    return LLMJudge(backend, server.name, cache=cache, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ('{"reasoning": "All covered.", "score": 3}', JudgeVerdict(3.0, "All covered.")),
        ('Sure!\n```json\n{"reasoning": "Half.", "score": "1.5"}\n```', JudgeVerdict(1.5, "Half.")),
        ('{"reasoning": "Two or three sentences", "score": 2, 1, 2 or 3}', JudgeVerdict(2.0, "Two or three sentences")),
        ('{"reasoning": "x", "score": 7}', "outside 0-3"),
        ('{"reasoning": "x", "score": "high"}', "not a number"),
        ('{"reasoning": "x"}', "lacks required keys: score"),
        ("The notes are fine.", "no JSON object"),
    ],
)
def test_parse_verdict(reply: str, expected: JudgeVerdict | str) -> None:
    got = parse_verdict(reply)
    if isinstance(expected, str):
        assert isinstance(got, str) and expected in got
    else:
        assert got == expected


def test_prompt_carries_the_inputs_and_the_contract() -> None:
    messages = judge_messages(JudgeItem(NOTES, TRUTH))
    last = messages[-1]["content"]
    assert "- Hold on. Put that in bullet points." in last and "- Use bullets." in last and NOTES in last
    assert '"score"' in last and "0 = " in last and "3 = " in last
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]  # one worked example first
    assert len(judge_messages(JudgeItem(NOTES, TRUTH), few_shot=False)) == 2
    assert "Reference notes" not in judge_messages(JudgeItem(NOTES, GroundTruth(("x",))))[-1]["content"]


@pytest.mark.slow
def test_malformed_after_retries_is_none_counted_and_bounded(smollm2_server: LocalServer, tmp_path: Path) -> None:
    # One token can never be a JSON verdict: every attempt is malformed. few_shot off keeps the prompt short.
    one_token = SamplingParams(temperature=0, max_tokens=1)
    judge = judge_for(smollm2_server, tmp_path, sampling=one_token, retries=1, max_concurrency=1, few_shot=False)
    items = [JudgeItem(f"- Use bullet points in case {i}.", TRUTH) for i in range(2)] + [JudgeItem("", TRUTH)]
    replies = [json.dumps({"user_preferences_reasoning": "r", "agent_notes": i.notes}) for i in items]
    scorer = RewardScorer(RewardConfig(), judge=judge)
    parts = scorer.score(replies, [TRUTH] * 3)
    assert [p.judge_failed for p in parts] == [True, True, False]  # the empty notes get 0 without asking
    assert all(p.score is None and p.coverage is None and p.format == 1.0 for p in parts[:2])
    assert parts[2].score == 0.0 and parts[2].judge_score == 0.0  # empty notes: unusable format, coverage 0
    assert scorer.last_batch_failures == 2 and scorer.stats()["judge_failures"] == 2
    assert judge.stats.failed == 2 and judge.stats.malformed == 4 and judge.stats.requests == 4
    backend = judge.backend
    assert isinstance(backend, OpenAIBackend)
    assert backend.usage.requests == 4  # 2 items x (1 try + 1 retry); the empty one never sent
    assert backend.peak_in_flight == 1  # the backend's bound is the judge's
    assert judge.cache is not None and len(judge.cache) == 0  # failures are not cached


@pytest.mark.slow
def test_cache_makes_the_second_call_skip_the_server(smollm2_server: LocalServer, tmp_path: Path) -> None:
    sampling = SamplingParams(temperature=0, max_tokens=24)
    first = judge_for(smollm2_server, tmp_path, sampling=sampling, retries=2)
    [verdict] = asyncio.run(first.score_many([JudgeItem(NOTES, TRUTH)]))
    assert verdict is not None and 0 <= verdict.score <= 3  # SmolLM2 copies the worked example's JSON shape
    assert first.backend.usage.requests >= 1
    second = judge_for(smollm2_server, tmp_path, sampling=sampling, retries=2)
    assert asyncio.run(second.score_many([JudgeItem(NOTES, TRUTH)])) == [verdict]
    assert second.backend.usage.requests == 0 and second.stats.cache_hits == 1
    other_model = LLMJudge(second.backend, "another-judge", cache=second.cache, retries=0, sampling=sampling)
    assert other_model.cache is not None and other_model.cache.get("another-judge", "0" * 64) is None


def test_unreachable_judge_fails_the_item_without_judge_retries(tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}/v1"
    model = OpenAIModelConfig(backend="openai", model="m", endpoint=endpoint, max_retries=0)
    judge = build_judge(JudgeConfig(kind="llm", model=model, cache_dir=str(tmp_path), retries=3))
    assert isinstance(judge, LLMJudge)
    assert asyncio.run(judge.score_many([JudgeItem(NOTES, TRUTH)])) == [None]
    assert judge.stats.requests == 1 and judge.stats.failed == 1  # HTTP retries belong to the client, not the judge


def test_llm_judge_needs_a_model() -> None:
    with pytest.raises(ValueError, match="needs a model"):
        JudgeConfig(kind="llm")


def test_batching_backend_gets_chunks_through_generate(tiny_qwen2: str) -> None:
    from memrl.rollout.hf_local import HFBackend

    backend = HFBackend(tiny_qwen2, device="cpu", batch_size=2)
    judge = LLMJudge(backend, "tiny-qwen2", SamplingParams(temperature=0, max_tokens=2), retries=0, few_shot=False)
    items = [JudgeItem(f"- Use bullet points ({i}).", TRUTH) for i in range(3)]
    assert asyncio.run(judge.score_many(items)) == [None, None, None]  # a random model writes no verdict
    assert backend.usage.requests == 3 and judge.stats.requests == 3 and judge.stats.failed == 3
