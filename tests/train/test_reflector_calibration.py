"""The calibrated next-session evaluation of reflectors: oracle, empty and wrong notes played before any model is
ranked, and `report.json`'s `outcome`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from support import ReflectionRows

from memrl.core.preferences import TAXONOMY, get_preference
from memrl.envs.collab.agents import oracle_notes
from memrl.envs.collab.next_session import NextSessionRow, wrong_preferences
from memrl.envs.collab.profiles import sample_profiles
from memrl.envs.collab.scripted_reader import ScriptedReader
from memrl.rewards.config import NextSessionRewardConfig
from memrl.train.report import write_report
from memrl.train.rewards.next_session import NextSessionScorer
from memrl.train.rewards.next_session_eval import CALIBRATION_FILE, by_user, outcome_report, rank_reflectors

LABELS = ("base", "sft", "grpo")


def test_wrong_notes_are_never_the_users_own() -> None:
    users = sample_profiles(300, seed=11)
    for user in users:
        wrong = wrong_preferences(user.id, user.preferences)
        assert len(wrong) == 3 and len(set(wrong)) == 3, (user.preferences, wrong)
        assert not set(wrong) & set(user.preferences), (user.preferences, wrong)
        assert wrong == wrong_preferences(user.id, user.preferences)  # fixed per user
        for own, other in zip(user.preferences, wrong, strict=True):
            pref = get_preference(own)
            assert other == pref.opposite if pref.opposite else TAXONOMY[other].category == pref.category
    # Habitual preferences have no opposite: which one is drawn depends on the user, not only on the preference.
    drawn = {wrong_preferences(u.id, u.preferences)[0] for u in users if u.preferences[0] == "bullets"}
    assert len(drawn) > 1
    # Three habitual preferences of one category (original-benchmark profiles can hold them): still none of them.
    wrong = wrong_preferences("u", ("bullets", "headings", "tldr"))
    assert len(set(wrong)) == 3 and not set(wrong) & {"bullets", "headings", "tldr"}
    assert oracle_notes(("direct",)).startswith("- You want answers that open with the substance")


def _units(rates: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {kind: {f"u{i}": r for i, r in enumerate(values)} for kind, values in rates.items()}


def test_the_reflectors_are_ranked_when_oracle_notes_beat_empty_ones() -> None:
    units = _units(
        {
            "oracle": [1.0, 1.0, 0.5, 1.0, 1.0, 0.5, 1.0, 1.0],
            "empty": [0.0, 0.5, 0.0, 0.5, 0.0, 0.0, 0.5, 0.0],
            "wrong": [0.0, 0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0],
            "base": [0.0, 0.5, 0.0, 0.5, 0.0, 0.0, 0.5, 0.0],
            "sft": [0.5, 0.5, 0.0, 1.0, 0.5, 0.0, 0.5, 0.5],
            "grpo": [1.0, 1.0, 0.5, 1.0, 0.5, 0.5, 1.0, 1.0],
        }
    )
    out = rank_reflectors(units, LABELS, resamples=500)
    calibration = out["calibration"]
    assert out["n"] == 8 and calibration["can_rank"] is True
    assert calibration["oracle"] == 0.875 and calibration["empty"] == 0.1875 and calibration["wrong"] == 0.0625
    assert calibration["oracle_minus_empty"] == 0.6875 and calibration["ci95"]["oracle_minus_empty"][0] > 0
    assert calibration["wrong_minus_empty"] == -0.125 and calibration["ci95"]["wrong_minus_empty"][1] <= 0
    assert out["pass_rate"] == {"base": 0.1875, "sft": 0.4375, "grpo": 0.8125}
    assert out["grpo_minus_base"] == 0.625 and out["ci95"]["grpo_minus_base"][0] > 0
    assert set(out["ci95"]) == {"sft_minus_base", "grpo_minus_base"}
    assert out["ranking"] == ["grpo", "sft", "base"] and "can rank" in out["verdict"]


def test_no_ranking_when_the_oracle_minus_empty_interval_includes_zero() -> None:
    units = _units(
        {
            "oracle": [1.0, 0.0, 0.5, 1.0, 0.0, 0.5],
            "empty": [0.5, 0.5, 0.5, 0.5, 0.5, 0.0],
            "wrong": [0.5, 0.0, 0.5, 0.5, 0.5, 0.0],
            "base": [0.0, 0.0, 0.5, 0.5, 0.0, 0.0],
            "sft": [0.5, 0.0, 0.5, 0.5, 0.0, 0.0],
            "grpo": [1.0, 0.5, 1.0, 1.0, 0.5, 0.5],
        }
    )
    out = rank_reflectors(units, LABELS, resamples=500)
    low, high = out["calibration"]["ci95"]["oracle_minus_empty"]
    assert low < 0 < high and out["calibration"]["can_rank"] is False
    assert out["ranking"] is None and out["verdict"].startswith("the signal cannot rank reflectors")
    # The numbers are still reported, a clear GRPO gain included: a reader sees them, but no ranking is claimed.
    assert out["pass_rate"]["grpo"] == 0.75 and out["ci95"]["grpo_minus_base"][0] > 0
    one = rank_reflectors(
        _units({k: [1.0 if k == "oracle" else 0.0] for k in ("oracle", "empty", "wrong", *LABELS)}), LABELS
    )
    assert one["calibration"]["ci95"]["oracle_minus_empty"] is None and one["calibration"]["can_rank"] is False
    assert "fewer than two units" in one["verdict"]
    # A reader that passes the same whatever its notes say (SmolLM2 on CPU): the interval is [0, 0], not above 0.
    deaf = rank_reflectors(_units({k: [0.0, 1.0, 0.0, 0.0] for k in ("oracle", "empty", "wrong", *LABELS)}), LABELS)
    assert deaf["calibration"]["ci95"]["oracle_minus_empty"] == [0.0, 0.0] and deaf["calibration"]["can_rank"] is False


def test_a_failed_unit_is_left_out_of_the_pairs() -> None:
    rows = [NextSessionRow(f"{u}/s0", u, ("direct", "polite", "bullets"), "arith", "p", 0) for u in "abc"]
    units = {kind: by_user(rows, [1.0, 0.0, 1.0]) for kind in ("oracle", "wrong", "base")}
    units["empty"] = by_user(rows, [0.0, None, 0.0])
    assert math.isnan(units["empty"]["b"])
    out = rank_reflectors(units, ("base",))
    assert out["calibration"]["empty"] == 0.0 and out["calibration"]["oracle_minus_empty"] == 1.0  # b left out


def _eval_dir(tmp_path: Path, rows: list[NextSessionRow], reflection_rows: ReflectionRows) -> tuple[Path, Path]:
    data = reflection_rows(rows)
    eval_dir = tmp_path / "eval"
    for n, label in enumerate(LABELS):  # base keeps no notes, sft one preference, grpo all three
        (eval_dir / label).mkdir(parents=True)
        lines = [
            {"key": r.key, "completion": json.dumps({"agent_notes": oracle_notes(r.preferences[: n + n // 2])}),
             "coverage": (n + n // 2) / 3}
            for r in rows
        ]  # fmt: skip
        (eval_dir / label / "scores.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return data, eval_dir


ROWS = [NextSessionRow(f"{p.id}/s0", p.id, p.preferences, "arith", "none", 0) for p in sample_profiles(10, seed=7)]


def test_a_note_follower_passes_the_calibration_and_ranks_the_models(
    tmp_path: Path, reflection_rows: ReflectionRows
) -> None:
    """The scripted agent meets what its notes state: oracle notes must beat empty ones, and the reflector whose notes
    name every preference comes first."""
    data, eval_dir = _eval_dir(tmp_path, ROWS, reflection_rows)
    scorer = NextSessionScorer(ScriptedReader(), max_turns=2)
    out = outcome_report(NextSessionRewardConfig(), data, eval_dir, list(LABELS), scorer=scorer, resamples=500)
    print(f"calibration, scripted note follower, {len(ROWS)} users: {out['calibration']}")
    assert out["calibration"]["can_rank"] is True and out["calibration"]["wrong_minus_empty"] <= 0
    assert out["ranking"][0] == "grpo" and out["pass_rate"]["grpo"] > out["pass_rate"]["base"]
    assert out["n"] == 10 and out["failures"] == 0 and out["unit"].startswith("user")
    assert out["outcome_agreement"]["n"] == 30 and out["outcome_agreement"]["spearman_outcome_vs_coverage"] > 0
    lines = [json.loads(line) for line in (eval_dir / CALIBRATION_FILE).read_text().splitlines()]
    assert [line["key"] for line in lines] == [r.key for r in ROWS] and set(lines[0]) >= {"oracle", "empty", "wrong"}
    report = json.loads(write_report(tmp_path, {"base": {"score": 1.0}}, None, {}, out).read_text())
    assert report["outcome"]["calibration"] == out["calibration"]


def test_outcome_keys_with_a_real_tiny_reader(tmp_path: Path, reflection_rows: ReflectionRows, tiny_qwen2: str) -> None:
    """A real model reads the notes (the transformers backend, a few tokens): every session is played, the report has
    every key whatever the model does."""
    data, eval_dir = _eval_dir(tmp_path, ROWS[:2], reflection_rows)
    cfg = NextSessionRewardConfig.model_validate(
        {"agent": {"backend": "hf", "model": tiny_qwen2}, "sampling": {"max_tokens": 8}}
    )
    out = outcome_report(cfg, data, eval_dir, list(LABELS), resamples=200)
    assert out["failures"] == 0 and out["agent"] == tiny_qwen2 and out["n"] == 2
    assert set(out["calibration"]) == {"oracle", "empty", "wrong", "oracle_minus_empty", "wrong_minus_empty", "ci95",
                                       "can_rank"}  # fmt: skip
    assert set(out["pass_rate"]) == set(LABELS) and {"sft_minus_base", "grpo_minus_base"} <= set(out)
    assert isinstance(out["verdict"], str) and (out["ranking"] is None) != out["calibration"]["can_rank"]
    # oracle, empty, wrong per row and the three models' notes (base's are empty: played once) - what was cached
    assert out["sessions"] <= 2 * 5


def test_one_row_per_user_and_at_most_the_users_asked_for(tmp_path: Path, reflection_rows: ReflectionRows) -> None:
    """A user's second row is not played (users are the units); `users` keeps the first ones in the eval order."""
    rows = [
        NextSessionRow(f"{r.user_id}/s{s}", r.user_id, r.preferences, "arith", "none", s)
        for r in ROWS[:4]
        for s in (0, 1)
    ]
    data, eval_dir = _eval_dir(tmp_path, rows, reflection_rows)
    scorer = NextSessionScorer(ScriptedReader(), max_turns=1)
    out = outcome_report(NextSessionRewardConfig(), data, eval_dir, list(LABELS), scorer=scorer, users=3, resamples=100)
    played = [json.loads(line)["key"] for line in (eval_dir / CALIBRATION_FILE).read_text().splitlines()]
    assert played == [f"{r.user_id}/s0" for r in ROWS[:3]] and out["n"] == 3
    assert len((eval_dir / "grpo" / "outcome_scores.jsonl").read_text().splitlines()) == 3


@pytest.mark.slow
def test_the_quickstart_writes_outcome(smoke_run: Path) -> None:
    outcome = json.loads((smoke_run / "report.json").read_text())["outcome"]
    assert outcome["n"] >= 2 and outcome["failures"] == 0
    assert set(outcome["pass_rate"]) == set(LABELS) and "grpo_minus_base" in outcome["ci95"]
    assert "oracle_minus_empty" in outcome["calibration"]["ci95"] and "outcome_agreement" in outcome
    assert (smoke_run / "eval" / CALIBRATION_FILE).is_file()
