"""TRL GRPOTrainer reward functions: one per reward part, so TRL logs each (`rewards/coverage/mean`, ...).

    funcs = reward_funcs(cfg)
    GRPOConfig(..., reward_weights=reward_weights(cfg))
    GRPOTrainer(..., reward_funcs=funcs, train_dataset=ds)   # ds has a `ground_truth` column (JSON strings)

The parts share one RewardScorer and TRL calls them one after another on the same batch, so the judge runs once
per batch: the first function scores it, the others read the cached parts. `length_penalty` returns the penalty
as a negative number, so every weight is positive and the weighted sum equals the scorer's total.

A sample whose judge failed gets None from every function: TRL then treats it as unscorable (left out of the
group baseline, advantage 0) instead of training on a partial reward; `judge_failures` is logged per batch.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from memrl.rewards.config import RewardConfig
from memrl.rewards.reward import RewardScorer
from memrl.rewards.types import RewardParts

if TYPE_CHECKING:  # TRL's own alias, so the list is exactly what GRPOTrainer(reward_funcs=...) takes
    from trl.trainer.grpo_trainer import RewardFunc


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
    """Scores a batch once and serves the cached parts to the other reward functions of the same batch."""

    def __init__(self, scorer: RewardScorer) -> None:
        self.scorer = scorer
        self._key: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        self._parts: list[RewardParts] = []
        self._lock = threading.Lock()

    def parts(self, completions: Sequence[Any], ground_truth: Sequence[Any]) -> tuple[list[RewardParts], bool]:
        """(parts, fresh): fresh is True when this call ran the judge."""
        texts = tuple(completion_text(c) for c in completions)
        truths = tuple(t if isinstance(t, str) else repr(t) for t in ground_truth)
        with self._lock:
            if self._key == (texts, truths):
                return self._parts, False
            self._parts = self.scorer.score(list(texts), list(ground_truth))
            self._key = (texts, truths)
            return self._parts, True


def _log(kwargs: dict[str, Any], parts: list[RewardParts], scorer: RewardScorer) -> None:
    log_metric = kwargs.get("log_metric")
    if callable(log_metric):  # TRL >= 1.x passes it to reward functions
        log_metric("judge_failures", float(scorer.last_batch_failures))
        tokens = [p.notes_tokens for p in parts]
        log_metric("notes_tokens", sum(tokens) / max(1, len(tokens)))


def reward_funcs(cfg: RewardConfig | None = None, scorer: RewardScorer | None = None) -> list[RewardFunc]:
    """[coverage, format] (+ length_penalty when configured), in the order `reward_weights` expects.

    Pass `scorer` to share one already built (its config then decides the parts).
    """
    scorer = scorer or RewardScorer(cfg or RewardConfig())
    cfg = scorer.cfg
    shared = _SharedParts(scorer)

    def scored(completions: Sequence[Any], ground_truth: Sequence[Any], kwargs: dict[str, Any]) -> list[RewardParts]:
        parts, fresh = shared.parts(completions, ground_truth)
        if fresh:
            _log(kwargs, parts, shared.scorer)
        return parts

    def coverage(
        prompts: Sequence[Any], completions: Sequence[Any], ground_truth: Sequence[Any], **kwargs: Any
    ) -> list[float | None]:
        return [p.coverage for p in scored(completions, ground_truth, kwargs)]

    def format(
        prompts: Sequence[Any], completions: Sequence[Any], ground_truth: Sequence[Any], **kwargs: Any
    ) -> list[float | None]:
        return [None if p.judge_failed else p.format for p in scored(completions, ground_truth, kwargs)]

    def length_penalty(
        prompts: Sequence[Any], completions: Sequence[Any], ground_truth: Sequence[Any], **kwargs: Any
    ) -> list[float | None]:
        return [None if p.judge_failed else -p.length_penalty for p in scored(completions, ground_truth, kwargs)]

    funcs: list[RewardFunc] = [coverage, format]
    if cfg.length_penalty is not None:
        funcs.append(length_penalty)
    return funcs


def reward_weights(cfg: RewardConfig | None = None) -> list[float]:
    """GRPOConfig.reward_weights for `reward_funcs(cfg)`: the coverage and format weights, 1.0 for the penalty."""
    cfg = cfg or RewardConfig()
    weights = [cfg.coverage_weight, cfg.format_weight]
    return [*weights, 1.0] if cfg.length_penalty is not None else weights
