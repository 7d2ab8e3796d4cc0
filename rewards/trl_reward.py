"""TRL GRPOTrainer reward functions: one per reward part, so TRL logs each (`rewards/coverage/mean`, ...).

    funcs = reward_funcs(cfg)
    GRPOConfig(..., reward_weights=reward_weights(cfg))
    GRPOTrainer(..., reward_funcs=funcs, train_dataset=ds)   # ds has a `ground_truth` column (JSON strings)

The parts share one RewardScorer and TRL calls them one after another on the same batch, so the judge runs once
per batch: the first function scores it, the others read the cached parts. `length_penalty` returns the penalty
as a negative number, so every weight is positive and the weighted sum equals the scorer's total.

A sample whose judge failed gets None from every function. TRL 1.16 (`GRPOTrainer._generate_and_score_completions`)
marks a row whose every function returned None unscorable: its reward is NaN, the group mean and std are nan-aware
(computed over the judged samples only) and its advantage is 0, exactly as if it were absent from the group. verl
gets the same through `memrl.rewards.verl_advantage`. The failed samples of each batch are logged as
`reward/judge_failed` (a count, averaged over the logging step), and an `UnscoredWatch`, when given, sees each
batch's count and stops the run once the judge keeps failing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from memrl.rewards.config import RewardConfig
from memrl.rewards.reward import RewardScorer
from memrl.rewards.types import RewardParts
from memrl.rewards.unscored import UnscoredWatch

JUDGE_FAILED_METRIC = "reward/judge_failed"

# TRL 1.16 accepts async reward functions, but its `RewardFunc` alias names only sync ones.
RewardFunc = Callable[..., Any]


def completion_text(completion: Any) -> str:
    """A TRL completion as text: a string, or a conversational list of messages (the assistant's content)."""
    if isinstance(completion, str):
        return completion
    texts = []
    for message in completion:
        if message.get("role", "assistant") != "assistant":
            continue
        content = message.get("content")
        if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        texts.append(content or "")
    return "".join(texts)


class _SharedParts:
    """Scores a batch once and serves the parts to the other reward functions of the same batch.

    TRL gathers its async reward functions on one event loop, so the first call starts the scoring task and the
    others await that same task.
    """

    def __init__(self, scorer: RewardScorer, watch: UnscoredWatch | None = None) -> None:
        self.scorer = scorer
        self.watch = watch
        self._key: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        self._task: asyncio.Future[list[RewardParts]] | None = None

    async def parts(
        self, completions: Sequence[Any], ground_truth: Sequence[Any], kwargs: dict[str, Any]
    ) -> list[RewardParts]:
        texts = tuple(completion_text(c) for c in completions)
        truths = tuple(t if isinstance(t, str) else repr(t) for t in ground_truth)
        task = self._task
        # A task of another event loop cannot be awaited here unless it is already done.
        stale = task is None or (not task.done() and task.get_loop() is not asyncio.get_running_loop())
        if self._key != (texts, truths) or stale:
            task = self._task = asyncio.ensure_future(self._score(list(texts), list(ground_truth), kwargs))
            self._key = (texts, truths)
        assert task is not None
        return await task

    async def _score(self, texts: list[str], ground_truth: list[Any], kwargs: dict[str, Any]) -> list[RewardParts]:
        parts = await self.scorer.ascore(texts, ground_truth)
        if self.watch is not None:  # one scored batch is one optimizer step (generation_batch_size)
            self.watch.observe(sum(p.judge_failed for p in parts), len(parts))
        log_metric = kwargs.get("log_metric")
        if callable(log_metric):  # TRL >= 1.x passes it to reward functions; it averages values over a logging step
            log_metric(JUDGE_FAILED_METRIC, float(sum(p.judge_failed for p in parts)))
            tokens = [p.notes_tokens for p in parts]
            log_metric("reward/notes_tokens", sum(tokens) / max(1, len(tokens)))
        return parts


def reward_funcs(
    cfg: RewardConfig | None = None, scorer: RewardScorer | None = None, watch: UnscoredWatch | None = None
) -> list[RewardFunc]:
    """[coverage, format] (+ length_penalty when configured), in the order `reward_weights` expects.

    Async functions: TRL 1.16 runs them on its own event loop thread, so the judge's requests go out on that loop.
    Pass `scorer` to share one already built (its config then decides the parts), `watch` to stop a run whose
    batches stay mostly unscored.
    """
    scorer = scorer or RewardScorer(cfg or RewardConfig())
    cfg = scorer.cfg
    shared = _SharedParts(scorer, watch)

    async def coverage(
        prompts: Sequence[Any], completions: Sequence[Any], ground_truth: Sequence[Any], **kwargs: Any
    ) -> list[float | None]:
        return [p.coverage for p in await shared.parts(completions, ground_truth, kwargs)]

    async def format(
        prompts: Sequence[Any], completions: Sequence[Any], ground_truth: Sequence[Any], **kwargs: Any
    ) -> list[float | None]:
        return [None if p.judge_failed else p.format for p in await shared.parts(completions, ground_truth, kwargs)]

    async def length_penalty(
        prompts: Sequence[Any], completions: Sequence[Any], ground_truth: Sequence[Any], **kwargs: Any
    ) -> list[float | None]:
        parts = await shared.parts(completions, ground_truth, kwargs)
        return [None if p.judge_failed else -p.length_penalty for p in parts]

    funcs: list[RewardFunc] = [coverage, format]
    if cfg.length_penalty is not None:
        funcs.append(length_penalty)
    return funcs


def reward_weights(cfg: RewardConfig | None = None) -> list[float]:
    """GRPOConfig.reward_weights for `reward_funcs(cfg)`: the coverage and format weights, 1.0 for the penalty."""
    cfg = cfg or RewardConfig()
    weights = [cfg.coverage_weight, cfg.format_weight]
    return [*weights, 1.0] if cfg.length_penalty is not None else weights
