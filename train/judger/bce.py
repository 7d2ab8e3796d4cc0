"""The memory judger's objective: binary cross-entropy on logits, with an optional weight on the positive class.

Judger data is imbalanced (few stored QA pairs answer a missing slot); weighting the positive terms by
negatives / positives makes both classes count equally in the loss.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def judger_bce(logits: torch.Tensor, labels: torch.Tensor, pos_weight: float | None = None) -> torch.Tensor:
    """Mean of -[w * y * log s + (1 - y) * log(1 - s)] with s = sigmoid(logit) and w = pos_weight (1 when None)."""
    import torch
    import torch.nn.functional as F

    logits = logits.reshape(-1).float()
    labels = labels.reshape(-1).to(logits)
    if logits.shape != labels.shape:
        raise ValueError(f"judger_bce: {logits.numel()} logits for {labels.numel()} labels")
    weight = None if pos_weight is None else torch.tensor(float(pos_weight), device=logits.device)
    return F.binary_cross_entropy_with_logits(logits, labels, pos_weight=weight)


def auto_pos_weight(labels: Iterable[int | float]) -> float:
    """negatives / positives of a training set (1.0 when either class is absent: nothing to balance)."""
    values = [float(y) for y in labels]
    positives = sum(1 for y in values if y >= 0.5)
    negatives = len(values) - positives
    if positives == 0 or negatives == 0:
        return 1.0
    return negatives / positives
