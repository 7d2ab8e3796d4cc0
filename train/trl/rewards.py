"""TRL GRPOTrainer reward functions: one per reward part, so TRL logs each (`rewards/coverage/mean`, ...).

    funcs, weights = grpo_rewards(cfg, data_dir)          # the reflection reward's parts and their weights
    GRPOConfig(..., reward_weights=weights)
    GRPOTrainer(..., reward_funcs=funcs, train_dataset=ds)   # ds has `ground_truth` (JSON strings) and `key` columns

The reflection reward is the registry's list of weighted parts (memrl.rewards.registry.reflection_parts); this
adapter holds no code of its own per part. One adapter serves every batch reward (`part_funcs`): the parts share
one scoring of each batch and TRL calls them one after another on the same batch, so each part scorer runs once per
batch: the first function scores it, the others read the cached parts. Every scorer's batch metrics are logged
(`reward/judge_failed`, `reward/notes_tokens`, `reward/outcome_failed`: counts and means, averaged over the logging
step). An online world's episode parts (`episode_funcs`) need no scorer: each reads the finished episode's record.

A sample a scorer could not score (its judge failed after its retries, its next session failed) gets None from that
scorer's functions. TRL 1.16 (`GRPOTrainer._generate_and_score_completions`) marks a row whose every function
returned None unscorable: its reward is NaN, the group mean and std are nan-aware (computed over the scored samples
only) and its advantage is 0, exactly as if it were absent from the group. verl gets the same through
`memrl.train.verl.advantage`. An `UnscoredWatch`, when given, sees each batch's count of samples without a reward
and stops the run once they keep coming. An episode the online rollout could not finish (a user simulator failure,
the token budget) has no record: every episode function returns None for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import memrl.train.rewards  # noqa: F401  (registers the next-session outcome)
from memrl.rewards.config import RewardConfig
from memrl.rewards.episode import PartWeights, Record
from memrl.rewards.parts import RewardPart, Sample, score_parts
from memrl.rewards.registry import reflection_parts
from memrl.rewards.unscored import UnscoredWatch
from memrl.train.distributed import world_size
from memrl.train.endpoints import per_process
from memrl.train.online.rollout import REPLIES_CUT, STATUSES
from memrl.train.trl.common import StepLog

# TRL 1.16 accepts async reward functions, but its `RewardFunc` alias names only sync ones.
RewardFunc = Callable[..., Any]
Parts = Mapping[str, float | None]
# (the completions as text, the other arguments TRL passed: dataset columns, log_metric) -> each sample's parts
BatchScore = Callable[[list[str], dict[str, Any]], Awaitable[list[Parts]]]


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


class BatchParts:
    """Scores a batch once and serves its parts to every reward function of the same batch.

    TRL gathers its async reward functions on one event loop, so the first call starts the scoring task and the
    others await that same task. A batch is known by its completions and the dataset `columns` the score reads.
    """

    def __init__(self, score: BatchScore, columns: Sequence[str]) -> None:
        self.score = score
        self.columns = tuple(columns)
        self._key: tuple[tuple[str, ...], ...] | None = None
        self._task: asyncio.Future[list[Parts]] | None = None

    async def parts(self, completions: Sequence[Any], kwargs: dict[str, Any]) -> list[Parts]:
        texts = [completion_text(c) for c in completions]
        values = (tuple(v if isinstance(v, str) else repr(v) for v in kwargs.get(c) or ()) for c in self.columns)
        key = (tuple(texts), *values)
        task = self._task
        # A task of another event loop cannot be awaited here unless it is already done.
        stale = task is None or (not task.done() and task.get_loop() is not asyncio.get_running_loop())
        if self._key != key or stale:
            task = self._task = asyncio.ensure_future(self.score(texts, kwargs))
            self._key = key
        assert task is not None
        return await task


def part_funcs(score: BatchScore, parts: Sequence[str], columns: Sequence[str]) -> list[RewardFunc]:
    """One async TRL reward function per part, named after it (TRL logs `rewards/<name>/mean`), all sharing one
    scoring of each batch. Async: TRL 1.16 runs them on its own event loop thread, so a scorer's requests go out on
    that loop."""
    shared = BatchParts(score, columns)

    def func(name: str) -> RewardFunc:
        async def reward(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
            return [p[name] for p in await shared.parts(completions, kwargs)]

        reward.__name__ = name
        return reward

    return [func(name) for name in parts]


def _log(kwargs: Mapping[str, Any], name: str, value: float) -> None:
    if callable(log_metric := kwargs.get("log_metric")):  # TRL >= 1.x passes it; it averages over a logging step
        log_metric(name, value)


def column(kwargs: Mapping[str, Any], name: str, n: int) -> list[Any]:
    """A dataset column TRL passed, or n Nones where the dataset has none."""
    values = kwargs.get(name)
    return list(values) if values is not None else [None] * n


def reflection_funcs(
    parts: Sequence[RewardPart], watch: UnscoredWatch | None = None, log: StepLog | None = None
) -> list[RewardFunc]:
    """One TRL reward function per part of the reflection reward, in the order of its weights (`[p.weight for p in
    parts]`). Each batch is scored once, every part's scorer once; each scorer's batch metrics are logged, `watch`,
    when given, sees how many samples of each batch have no reward, and `log`, when given, gets each sample's `key`,
    weighted `reward` and `parts` under the step it trains (what the curve's within-prompt slope reads)."""

    async def score(texts: list[str], kwargs: dict[str, Any]) -> list[Parts]:
        n = len(texts)
        truths, keys = column(kwargs, "ground_truth", n), column(kwargs, "key", n)
        batch = await score_parts(parts, [Sample(*s) for s in zip(texts, truths, keys, strict=True)])
        if watch is not None:  # one scored batch is one optimizer step (generation_batch_size)
            watch.observe(sum(t is None for t in batch.totals), n)
        for name, value in batch.metrics.items():
            _log(kwargs, name, value)
        if log is not None and (state := kwargs.get("trainer_state")) is not None:
            rows = zip(keys, batch.totals, batch.values, strict=True)
            log.write(int(state.global_step) + 1, ({"key": k, "reward": t, "parts": dict(v)} for k, t, v in rows))
        return [*batch.values]

    return part_funcs(score, [p.name for p in parts], ["ground_truth", "key"])


def grpo_rewards(
    reward: RewardConfig, data_dir: Path, watch: UnscoredWatch | None = None, log: StepLog | None = None
) -> tuple[list[RewardFunc], list[float]]:
    """(reward_funcs, reward_weights) for GRPOTrainer: the reflection reward's parts (memrl.rewards.registry) and
    their weights; `watch` stops the run when its batches stay mostly unscored, `log` keeps every sample's reward.
    Each of the launch's processes scores
    its own batches with its own clients: every endpoint's `max_concurrency` is divided over them (`per_process`),
    so the judge sees the recipe's bound."""
    parts = reflection_parts(per_process(reward, world_size(), "reward"), data_dir)
    return reflection_funcs(parts, watch, log), [p.weight for p in parts]


def _episode_part(weights: type[PartWeights], name: str) -> RewardFunc:
    def reward(completions: Sequence[Any], episode: Sequence[Record | None], **kwargs: Any) -> list[float | None]:
        if name == weights.names()[0]:  # counted once per batch, where the rewards are
            statuses = kwargs.get("episode_status") or []
            for status in STATUSES:
                _log(kwargs, f"episode/{status}", float(sum(s == status for s in statuses)))
            if cut := [float(c) for c in kwargs.get(REPLIES_CUT) or [] if c is not None]:
                _log(kwargs, f"episode/{REPLIES_CUT}", sum(cut) / len(cut))
        return [None if record is None else weights.parts(record)[name] for record in episode]

    reward.__name__ = name  # TRL logs each function as rewards/<__name__>/mean
    return reward


def episode_funcs(weights: type[PartWeights]) -> list[RewardFunc]:
    """An online world's episode reward: one sync TRL function per part of `weights`, in their order (the order of
    `as_list`). Each reads the episode record the rollout forwards as the extra field `episode`; the first part's also
    logs how many episodes of the batch ended each way (`episode/<status>`) and the share of replies cut at the reply
    budget (`episode/replies_cut`)."""
    return [_episode_part(weights, name) for name in weights.names()]
