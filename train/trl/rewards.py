"""TRL GRPOTrainer reward functions: one per reward part, so TRL logs each (`rewards/coverage/mean`, ...).

    funcs, weights = grpo_rewards(cfg, data_dir)          # the reflection reward, the next-session outcome mixed in
    GRPOConfig(..., reward_weights=weights)
    GRPOTrainer(..., reward_funcs=funcs, train_dataset=ds)   # ds has `ground_truth` (JSON strings) and `key` columns

One adapter serves every batch reward (`part_funcs`): the parts of a reward share one scorer and TRL calls them one
after another on the same batch, so the scorer runs once per batch: the first function scores it, the others read
the cached parts. `length_penalty` returns the penalty as a negative number, so every weight is positive and the
weighted sum equals the judge scorer's total. The collab episode's parts (`episode_funcs`) need no scorer: each
reads the finished episode's record.

A sample whose judge failed gets None from every judge function. TRL 1.16
(`GRPOTrainer._generate_and_score_completions`) marks a row whose every function returned None unscorable: its
reward is NaN, the group mean and std are nan-aware (computed over the judged samples only) and its advantage is 0,
exactly as if it were absent from the group. verl gets the same through `memrl.train.verl.advantage`. The failed
samples of each batch are logged as `reward/judge_failed` (a count, averaged over the logging step), and an
`UnscoredWatch`, when given, sees each batch's count and stops the run once the judge keeps failing. The
next-session outcome (`next_session_func`) reads each completion's notes as the agent would store them and the
row's user from the dataset's `key` column; a sample whose next session failed gets None and is counted as
`reward/outcome_failed`. An episode the collab rollout could not finish (a user simulator failure, the token
budget) has no record: every episode function returns None for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from memrl.core.errors import ConfigError
from memrl.envs.collab.next_session import NextSessionRow, load_rows
from memrl.rewards.collab_episode import PARTS, REPLIES_CUT, STATUSES, Record, episode_parts
from memrl.rewards.config import RewardConfig
from memrl.rewards.format import extract_notes
from memrl.rewards.reward import RewardScorer
from memrl.rewards.unscored import UnscoredWatch
from memrl.train.distributed import world_size
from memrl.train.endpoints import per_process
from memrl.train.rewards.next_session import NextSessionScorer, build_scorer

JUDGE_FAILED_METRIC = "reward/judge_failed"
FAILED_METRIC = "reward/outcome_failed"

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


def reward_funcs(
    cfg: RewardConfig | None = None, scorer: RewardScorer | None = None, watch: UnscoredWatch | None = None
) -> list[RewardFunc]:
    """The judge reward: [coverage, format] (+ length_penalty when configured), in the order `reward_weights`
    expects. Pass `scorer` to share one already built (its config then decides the parts), `watch` to stop a run
    whose batches stay mostly unscored."""
    scorer = scorer or RewardScorer(cfg or RewardConfig())
    names = ["coverage", "format"] + (["length_penalty"] if scorer.cfg.length_penalty is not None else [])

    async def score(texts: list[str], kwargs: dict[str, Any]) -> list[Parts]:
        parts = await scorer.ascore(texts, list(kwargs["ground_truth"]))
        failed = sum(p.judge_failed for p in parts)
        if watch is not None:  # one scored batch is one optimizer step (generation_batch_size)
            watch.observe(failed, len(parts))
        _log(kwargs, JUDGE_FAILED_METRIC, float(failed))
        _log(kwargs, "reward/notes_tokens", sum(p.notes_tokens for p in parts) / max(1, len(parts)))
        return [
            {
                "coverage": p.coverage,
                "format": None if p.judge_failed else p.format,
                "length_penalty": None if p.judge_failed else -p.length_penalty,
            }
            for p in parts
        ]

    return part_funcs(score, names, ["ground_truth"])


def reward_weights(cfg: RewardConfig | None = None) -> list[float]:
    """GRPOConfig.reward_weights for `reward_funcs(cfg)`: the coverage and format weights, 1.0 for the penalty."""
    cfg = cfg or RewardConfig()
    weights = [cfg.coverage_weight, cfg.format_weight]
    return [*weights, 1.0] if cfg.length_penalty is not None else weights


def next_session_func(scorer: NextSessionScorer, rows: Mapping[str, NextSessionRow]) -> RewardFunc:
    """The next-session outcome as one reward function, `outcome` (its notes: the reflection JSON's `agent_notes`;
    none: "")."""

    async def score(texts: list[str], kwargs: dict[str, Any]) -> list[Parts]:
        key = kwargs.get("key")
        if key is None:
            raise ConfigError("the outcome reward needs the dataset's `key` column (the reflection row's key)")
        if missing := [k for k in key if k not in rows]:
            raise ConfigError(f"outcome reward: row {missing[0]!r} is not in the reflection data it was built from")
        notes = [extract_notes(text) or "" for text in texts]
        parts = await scorer.ascore([(n, rows[k]) for n, k in zip(notes, key, strict=True)])
        _log(kwargs, FAILED_METRIC, float(sum(p.failed for p in parts)))
        return [{"outcome": p.score} for p in parts]

    return part_funcs(score, ["outcome"], ["key"])[0]


def grpo_rewards(
    reward: RewardConfig, data_dir: Path, watch: UnscoredWatch | None = None
) -> tuple[list[RewardFunc], list[float]]:
    """(reward_funcs, reward_weights) for GRPOTrainer: the judge reward's, plus the next-session outcome and its
    weight when `reward.outcome` is set (its rows from `outcome.data` or `data_dir`); `watch` stops the run when the
    judge keeps failing. Each of the launch's processes scores its own batches with its own clients: every
    endpoint's `max_concurrency` is divided over them (`per_process`), so the judge sees the recipe's bound."""
    reward = per_process(reward, world_size(), "reward")
    funcs, weights = reward_funcs(reward, watch=watch), reward_weights(reward)
    if reward.outcome is None:
        return funcs, weights
    rows = load_rows(reward.outcome.data or data_dir)
    return [*funcs, next_session_func(build_scorer(reward.outcome), rows)], [*weights, reward.outcome.weight]


def _episode_part(name: str) -> RewardFunc:
    def reward(completions: Sequence[Any], episode: Sequence[Record | None], **kwargs: Any) -> list[float | None]:
        if name == "task_success":  # counted once per batch, where the rewards are
            statuses = kwargs.get("episode_status") or []
            for status in STATUSES:
                _log(kwargs, f"episode/{status}", float(sum(s == status for s in statuses)))
            if cut := [float(c) for c in kwargs.get(REPLIES_CUT) or [] if c is not None]:
                _log(kwargs, f"episode/{REPLIES_CUT}", sum(cut) / len(cut))
        return [None if record is None else episode_parts(record)[name] for record in episode]

    reward.__name__ = name  # TRL logs each function as rewards/<__name__>/mean
    return reward


def episode_funcs() -> list[RewardFunc]:
    """The collab episode reward: one sync TRL function per part, in `PARTS` order (the order of
    `EpisodeRewardWeights.as_list`). Each reads the episode record the rollout forwards as the extra field `episode`;
    `task_success` also logs how many episodes of the batch ended each way (`episode/<status>`) and the share of
    replies cut at the reply budget (`episode/replies_cut`)."""
    return [_episode_part(name) for name in PARTS]
