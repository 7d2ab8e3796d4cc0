"""`HFBackend`: batched generation equals one-at-a-time; `RowSeededSampling`: a row's draw follows the tempered,
top-p filtered softmax and depends on its own seed only."""

from __future__ import annotations

import asyncio

import pytest
import torch

from memrl.rollout import SamplingParams
from memrl.rollout.base import Conversation
from memrl.rollout.hf_local import HFBackend, RowSeededSampling, row_seeds

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


def test_decodes_with_the_split_attention_on_cpu(tiny: HFBackend) -> None:
    from memrl.core.attention import split_attention

    assert tiny.model.config._attn_implementation == split_attention()


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


# RowSeededSampling
SCORES = torch.tensor([2.0, 1.0, 0.0, -1.0, -3.0])


def draws(seeds: list[int], temperature: float, top_p: float = 1.0) -> torch.Tensor:
    sampler = RowSeededSampling(seeds, temperature, top_p, "cpu")
    scores = SCORES.repeat(len(seeds), 1)
    ids = torch.zeros(len(seeds), 1, dtype=torch.long)
    return sampler(ids, scores).argmax(dim=-1)  # type: ignore[arg-type]


def test_draws_follow_the_tempered_softmax() -> None:
    tokens = draws(list(range(8000)), temperature=0.7)
    freq = torch.bincount(tokens, minlength=5).float() / len(tokens)
    want = torch.softmax(SCORES / 0.7, dim=-1)
    assert torch.allclose(freq, want, atol=0.02), (freq, want)


def test_top_p_keeps_to_the_nucleus() -> None:
    # p = softmax(SCORES): 0.64, 0.23, 0.09, 0.03, 0.004; the smallest set reaching 0.8 is tokens 0 and 1.
    tokens = draws(list(range(4000)), temperature=1.0, top_p=0.8)
    counts = torch.bincount(tokens, minlength=5)
    assert counts[2:].sum() == 0 and counts[0] > counts[1] > 0


def test_a_rows_draws_do_not_depend_on_its_batch() -> None:
    seeds = row_seeds(0, ["a", "b", "c", "d"] * 8)
    assert torch.equal(draws(seeds, 1.0), torch.cat([draws([s], 1.0) for s in seeds]))

    def steps(order: list[int]) -> list[torch.Tensor]:
        sampler = RowSeededSampling(order, 1.0, 1.0, "cpu")
        ids = torch.zeros(len(order), 1, dtype=torch.long)
        return [sampler(ids, SCORES.repeat(len(order), 1)).argmax(-1) for _ in range(20)]  # type: ignore[arg-type]

    forward, backward = steps(seeds[:3]), steps(seeds[:3][::-1])
    assert all(torch.equal(a, b.flip(0)) for a, b in zip(forward, backward, strict=True))
    assert len({tuple(step.tolist()) for step in forward}) > 1  # each row's generator moves on from step to step


def test_row_seeds_depend_on_seed_prompt_and_repeat_index() -> None:
    seeds = row_seeds(0, ["x", "y", "x"])
    assert len(set(seeds)) == 3  # the two "x" rows are two requests, not one
    assert row_seeds(0, ["y", "x", "x"]) == [seeds[1], seeds[0], seeds[2]]
    assert row_seeds(1, ["x"])[0] != seeds[0]
    assert all(0 <= s < 2**63 for s in seeds)
