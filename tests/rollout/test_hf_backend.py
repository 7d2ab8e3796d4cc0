from __future__ import annotations

import asyncio

import pytest

from memrl.rollout import SamplingParams
from memrl.rollout.base import Conversation
from memrl.rollout.hf_local import HFBackend

PROMPTS: list[Conversation] = [
    [{"role": "user", "content": "hello"}],
    [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "the user prefers short answers with bullet points"},
    ],
    [{"role": "user", "content": "1 + 2 = ?"}],
]


@pytest.fixture(scope="module")
def tiny(tiny_qwen2: str) -> HFBackend:
    # float32: a padded batch equals separate calls exactly only there (the `auto` default is bf16 on a CPU with bf16
    # instructions, where padding changes the rounding and a random tiny model's near-tied logits flip)
    return HFBackend(tiny_qwen2, device="cpu", dtype="float32", batch_size=3)


def test_batched_greedy_equals_one_at_a_time(tiny: HFBackend) -> None:
    # Left padding and attention masks must make a batch behave like separate calls.
    greedy = SamplingParams(temperature=0, max_tokens=12)
    batched = [c.text for c in tiny.generate(PROMPTS, greedy)]
    single = [tiny.chat(p, greedy).text for p in PROMPTS]
    assert batched == single
    assert len(set(batched)) > 1


def test_usage_and_max_tokens(tiny: HFBackend) -> None:
    before = tiny.usage.as_dict()
    completions = tiny.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=5))
    assert all(c.completion_tokens <= 5 for c in completions)
    assert all(c.finish_reason in ("stop", "length") for c in completions)
    after = tiny.usage.as_dict()
    assert after["requests"] - before["requests"] == 3
    assert after["prompt_tokens"] - before["prompt_tokens"] == sum(c.prompt_tokens for c in completions) > 0


def test_seed_makes_sampling_repeatable(tiny: HFBackend) -> None:
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=123)
    first = [c.text for c in tiny.generate(PROMPTS, params)]
    assert first == [c.text for c in tiny.generate(PROMPTS, params)]
    other = [c.text for c in tiny.generate(PROMPTS, SamplingParams(temperature=1.0, max_tokens=16, seed=7))]
    assert other != first


def test_a_seeded_rows_text_does_not_depend_on_its_batch(tiny: HFBackend) -> None:
    # Batches form by timing in a run; a seeded request must give the same text whichever rows it decodes beside.
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=5)
    together = [c.text for c in tiny.generate(PROMPTS, params)]
    reordered = [c.text for c in tiny.generate([PROMPTS[2], PROMPTS[0], PROMPTS[1]], params)]
    alone = [tiny.chat(p, params).text for p in PROMPTS]
    assert together == [reordered[1], reordered[2], reordered[0]] == alone
    assert together != [c.text for c in tiny.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=16))]


def test_identical_seeded_requests_in_one_call_are_separate_samples(tiny: HFBackend) -> None:
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=5)
    texts = [c.text for c in tiny.generate([PROMPTS[0]] * 3, params)]
    assert len(set(texts)) == 3
    assert texts[0] == tiny.chat(PROMPTS[0], params).text  # the first of them is the request made alone


def test_stop_strings_cut_the_text(tiny: HFBackend) -> None:
    free = tiny.chat(PROMPTS[1], SamplingParams(temperature=0, max_tokens=24)).text
    assert len(free) > 4
    stop = free[2:4]
    cut = tiny.chat(PROMPTS[1], SamplingParams(temperature=0, max_tokens=24, stop=(stop,)))
    assert stop not in cut.text and free.startswith(cut.text)
    assert cut.finish_reason == "stop"


def test_achat_runs_concurrently_safely(tiny: HFBackend) -> None:
    greedy = SamplingParams(temperature=0, max_tokens=8)

    async def both() -> list[str]:
        results = await asyncio.gather(*(tiny.achat(p, greedy) for p in PROMPTS))
        return [r.text for r in results]

    assert asyncio.run(both()) == [c.text for c in tiny.generate(PROMPTS, greedy)]


@pytest.mark.slow
def test_smollm2_answers_a_factual_question(smollm2: str) -> None:
    backend = HFBackend(smollm2, device="cpu")
    answer = backend.chat(
        [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
        SamplingParams(temperature=0, max_tokens=16),
    )
    assert "paris" in answer.text.lower()


def test_concurrent_achat_calls_decode_in_one_batch(tiny: HFBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sessions sharing a process ask at once; their turns must share a decoding pass (at most `batch_size`), and
    each caller gets its own conversation's reply."""
    greedy = SamplingParams(temperature=0, max_tokens=8)
    batches: list[int] = []
    generate = tiny.generate

    def counting(conversations: list[Conversation], params: SamplingParams | None = None) -> list:
        batches.append(len(conversations))
        return generate(conversations, params)

    monkeypatch.setattr(tiny, "generate", counting)

    async def ask() -> list[str]:
        done = await asyncio.gather(*(tiny.achat(p, greedy) for p in [*PROMPTS, PROMPTS[0]]))
        return [c.text for c in done]

    texts = asyncio.run(ask())
    assert batches == [3, 1]  # four callers, batch_size 3: one full batch, then the one left
    assert texts == [c.text for c in generate([*PROMPTS, PROMPTS[0]], greedy)]
    other = SamplingParams(temperature=0, max_tokens=4)

    async def two_settings() -> None:
        await asyncio.gather(tiny.achat(PROMPTS[0], greedy), tiny.achat(PROMPTS[1], other))

    batches.clear()
    asyncio.run(two_settings())
    assert sorted(batches) == [1, 1]  # a batch decodes with one setting
