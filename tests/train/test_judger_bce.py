"""The judger's BCE objective: the formula, and the weight on the positive terms."""

from __future__ import annotations

import pytest
import torch

from memrl.train.judger.bce import auto_pos_weight, judger_bce


def reference(logits: torch.Tensor, labels: torch.Tensor, w: float = 1.0) -> torch.Tensor:
    s = torch.sigmoid(logits)
    return -(w * labels * torch.log(s) + (1 - labels) * torch.log(1 - s)).mean()


def test_bce_matches_the_formula() -> None:
    logits = torch.tensor([2.0, -1.0, 0.5, -3.0, 0.0])
    labels = torch.tensor([1, 0, 0, 1, 1])
    assert judger_bce(logits, labels).item() == pytest.approx(reference(logits, labels.float()).item(), rel=1e-6)
    assert judger_bce(logits, labels, 3.0).item() == pytest.approx(
        reference(logits, labels.float(), 3.0).item(), rel=1e-6
    )


def test_pos_weight_scales_only_the_positive_terms() -> None:
    logits = torch.tensor([0.3, -0.7, 1.2, -0.1], requires_grad=True)
    labels = torch.tensor([1.0, 0.0, 1.0, 0.0])
    judger_bce(logits, labels).backward()
    plain = logits.grad.clone()
    logits.grad = None
    judger_bce(logits, labels, 4.0).backward()
    assert logits.grad is not None
    weighted = logits.grad
    assert torch.allclose(weighted[labels == 1], 4.0 * plain[labels == 1])
    assert torch.allclose(weighted[labels == 0], plain[labels == 0])
    negatives_only = torch.zeros(4)
    assert judger_bce(logits, negatives_only, 4.0).item() == pytest.approx(judger_bce(logits, negatives_only).item())


def test_auto_pos_weight_balances_the_classes() -> None:
    assert auto_pos_weight([1, 0, 0, 0, 1, 0]) == 2.0
    assert auto_pos_weight([0, 0]) == 1.0 and auto_pos_weight([1]) == 1.0


def test_shape_mismatch_is_refused() -> None:
    with pytest.raises(ValueError, match="3 logits for 2 labels"):
        judger_bce(torch.zeros(3), torch.zeros(2))
