"""`RowSeededSampling`: a row's draw follows the tempered, top-p filtered softmax and depends on its own seed only."""

from __future__ import annotations

import torch

from memrl.rollout.seeded_sampling import RowSeededSampling, row_seeds

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
