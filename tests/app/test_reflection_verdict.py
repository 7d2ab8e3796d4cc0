"""What the eval stage prints of the learning verdict: a gain the interval does not carry comes with the smallest
gain those sessions could have shown, so a reader knows what "not shown" rules out."""

from __future__ import annotations

import io
import random
from pathlib import Path

from rich.console import Console

from memrl.app.context import RunContext
from memrl.app.stages.reflection import _print_verdict
from memrl.train.report import learning_verdict


def _rows(scores: list[float]) -> list[dict[str, object]]:
    return [{"key": f"u{i}/s0", "score": s} for i, s in enumerate(scores)]


def _printed(report: dict[str, object], tmp_path: Path) -> str:
    sink = io.StringIO()
    ctx = RunContext(name="r", seed=0, run_dir=tmp_path, console=Console(file=sink, width=400, color_system=None))
    _print_verdict(report, ctx, "eval")
    return sink.getvalue()


def test_not_shown_says_which_gain_these_sessions_could_have_shown(tmp_path: Path) -> None:
    rng = random.Random(5)
    sft = [round(rng.uniform(0.5, 2.0), 2) for _ in range(60)]
    noisy = learning_verdict({"sft": _rows(sft), "grpo": _rows([s + rng.choice([-0.7, 0.8]) for s in sft])})
    assert noisy is not None and noisy["verdict"] is False
    printed = _printed({"held_out": {}, "learning": noisy}, tmp_path)
    assert "learning not shown" in printed
    assert f"a true gain shows 4 times in 5 only from {noisy['detectable']} up" in printed

    clear = learning_verdict({"sft": _rows(sft), "grpo": _rows([s + 0.3 + rng.uniform(-0.05, 0.05) for s in sft])})
    assert clear is not None and clear["verdict"] is True
    printed = _printed({"held_out": {}, "learning": clear}, tmp_path)
    assert "learning shown" in printed and "4 times in 5" not in printed
