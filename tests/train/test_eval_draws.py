"""Several sampled notes per held-out session (`stages.eval.draws`): each draw repeats itself, draws differ, a
session's measures are the mean of its draws, and a killed evaluation resumes the draws it had not written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError
from rich.console import Console

from memrl.rewards.config import RewardConfig
from memrl.rollout.base import SamplingParams
from memrl.train.evaluate import EvalReflectorConfig, draw_key, evaluate_reflector
from memrl.train.report import learning_verdict, model_intervals, session_measure

SAMPLED = SamplingParams(temperature=1.0, max_tokens=12, seed=3)


def _data(tmp_path: Path, n: int = 4) -> Path:
    rows = [
        {
            "key": f"user-{i}/s0",
            "prompt": [{"role": "user", "content": f"Session {i}: the user asked for bullet points. Write notes."}],
            "ground_truth": {"enforcements": ["Use bullet points."], "gold_notes": "", "expected": ["bullets"]},
        }
        for i in range(n)
    ]
    path = tmp_path / "data" / "rl" / "eval.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path / "data"


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_draws_repeat_differ_average_and_resume(tiny_qwen2: str, tmp_path: Path) -> None:
    data, console = _data(tmp_path), Console(quiet=True)

    def evaluate(out: str, draws: int) -> dict:
        return evaluate_reflector(tiny_qwen2, data, tmp_path / out, RewardConfig(), SAMPLED, console, draws=draws)

    one, three = evaluate("one", 1), evaluate("three", 3)
    assert one["n"] == three["n"] == 4 and three["draws"] == 3
    single = {r["key"]: r["completion"] for r in _lines(tmp_path / "one" / "generations.jsonl")}
    drawn = {r["key"]: r["completion"] for r in _lines(tmp_path / "three" / "generations.jsonl")}
    assert len(drawn) == 12 and {draw_key("user-0/s0", 2)} <= drawn.keys()
    # Draw 0 is what a one-draw run samples (the same seed); later draws sample at seed + n, so they differ.
    assert all(drawn[key] == text for key, text in single.items())
    assert any(drawn[draw_key(k, 1)] != drawn[k] for k in single)
    # One line per session: its first draw on top, every draw under `draws`, and the session measure their mean.
    scored = _lines(tmp_path / "three" / "scores.jsonl")
    assert [r["key"] for r in scored] == sorted(single) and all(len(r["draws"]) == 3 for r in scored)
    assert all(r["completion"] == r["draws"][0]["completion"] == single[r["key"]] for r in scored)
    for row in scored:
        assert session_measure(row, "score") == pytest.approx(sum(d["score"] for d in row["draws"]) / 3)
    assert "draws" not in _lines(tmp_path / "one" / "scores.jsonl")[0]
    # A run killed after its first draws resumes the rest and regenerates nothing it had.
    generations = tmp_path / "three" / "generations.jsonl"
    kept = generations.read_text().splitlines(keepends=True)
    generations.write_text("".join(kept[:6]))
    evaluate("three", 3)
    resumed = generations.read_text().splitlines(keepends=True)
    assert resumed[:6] == kept[:6] and {r["key"] for r in _lines(generations)} == drawn.keys() and len(resumed) == 12


def test_a_session_is_the_mean_of_its_draws() -> None:
    """An unlucky first draw does not decide a session; a draw the judge failed on is left out of its mean."""

    def row(key: str, scores: list[float | None]) -> dict:
        draws = [{"score": s, "format": 0.0 if s == 0 else 1.0, "notes_tokens": 20} for s in scores]
        return {"key": key, **draws[0], "draws": draws}

    sft = [row(f"u{i}", [1.0, 1.0, 1.0]) for i in range(30)]
    grpo = [row(f"u{i}", [0.0, 1.6, 1.6]) for i in range(30)]  # every first draw broke; the mean is higher
    verdict = learning_verdict({"sft": sft, "grpo": grpo})
    assert verdict is not None and verdict["verdict"] is True and verdict["delta"] == pytest.approx(1 / 15, abs=1e-4)
    intervals = model_intervals(grpo)
    assert intervals["format_failure"]["mean"] == pytest.approx(1 / 3, abs=1e-4)
    assert session_measure(row("x", [None, 1.5]), "score") == 1.5


def test_several_greedy_draws_are_refused() -> None:
    base = {"data": "data", "models": {"base": "policy"}}
    assert EvalReflectorConfig.model_validate(base | {"draws": 2, "sampling": {"temperature": 0.7}}).draws == 2
    with pytest.raises(ValidationError, match="more than one draw needs a sampling temperature above 0"):
        EvalReflectorConfig.model_validate(base | {"draws": 2})


def test_draws_per_model_label() -> None:
    """A label -> number mapping draws those models that often and the others once; a label that is no model, or
    several greedy draws of any model, is refused."""
    base = {"data": "data", "models": {"base": "policy", "sft": "sft", "grpo": "export"}}
    sampled = base | {"sampling": {"temperature": 0.7}}
    cfg = EvalReflectorConfig.model_validate(sampled | {"draws": {"sft": 2, "grpo": 3}})
    assert [cfg.draws_of(label) for label in cfg.models] == [1, 2, 3]
    assert cfg.draws_said() == ", draws a session: base 1, sft 2, grpo 3"
    assert EvalReflectorConfig.model_validate(sampled | {"draws": 2}).draws_said() == ", 2 draws a session"
    assert EvalReflectorConfig.model_validate(sampled | {"draws": {"base": 1}}).draws_said() == ""
    with pytest.raises(ValidationError, match=r"draws: rl is not a label of `models` \(base, sft, grpo\)"):
        EvalReflectorConfig.model_validate(sampled | {"draws": {"rl": 2}})
    with pytest.raises(ValidationError, match="more than one draw needs a sampling temperature above 0"):
        EvalReflectorConfig.model_validate(base | {"draws": {"grpo": 2}})
