"""The held-out base-vs-trained report of collab GRPO (memrl.train.heldout) built from fixed session records, and
the sessions it plays (the eval side of the training stage's split, as the policy trained). The recipe run itself is
in test_online_collab.py's smoke test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from memrl.app.recipe import load_recipe
from memrl.core.stats import paired_difference
from memrl.envs.collab.records import SessionRecord
from memrl.envs.collab.runner import select_problems, select_profiles
from memrl.train.heldout import METRICS, forget_if_retrained, heldout_chart, heldout_config, heldout_report
from memrl.train.online.config import STAGES
from memrl.train.online.episodes import episode_rows
from memrl.train.report import merge_report

PREFS = ["terse", "cheerful", "numbered"]


def _record(user: str, session: int, problem: str, broken: list[list[str]], success: int, effort: int) -> SessionRecord:
    """A session record as the collab runner writes it: one user reaction per list in `broken` (the preferences
    its checkers found violated); `broken=[]`: the user reacted to no reply."""
    turns: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    for violated in broken:
        reaction = {"role": "user", "content": "hm", "checker_violated": violated}
        turns += [{"role": "assistant", "content": "ok"}, reaction]
    row = {
        "user_id": user,
        "session": session,
        "task": "arith",
        "problem_id": problem,
        "preferences": PREFS,
        "turns": turns,
        "task_success": success,
        "user_effort": effort,
        "length": len(turns),
    }
    return SessionRecord.from_dict(row, "test")


BASE = [
    _record("u1", 0, "p1", [["terse", "cheerful"], ["terse"]], 0, 2),  # preference (1/3 + 2/3) / 2 = 0.5
    _record("u2", 0, "p2", [["terse"]], 1, 1),  # 2/3
    _record("u3", 0, "p3", [[]], 0, 0),  # 1
    _record("u4", 0, "p4", [["numbered"]], 0, 1),  # 2/3
    _record("u5", 0, "p5", [["terse"]], 1, 1),  # only the base finished it: left out
]
TRAINED = [  # another order: sessions pair by (user, session, problem), not by position
    _record("u4", 0, "p4", [], 1, 0),  # no reaction: no preference score, the other metrics still pair
    _record("u3", 0, "p3", [[]], 1, 0),  # 1
    _record("u2", 0, "p2", [[]], 1, 0),  # 1
    _record("u1", 0, "p1", [[], []], 1, 0),  # 1
    _record("u1", 0, "p9", [[]], 1, 0),  # another problem: no base to pair with
]


def test_the_report_pairs_sessions_by_id_and_bootstraps_each_difference() -> None:
    report = heldout_report(BASE, TRAINED, seed=3, resamples=500)

    assert set(report) == {"n", "unpaired", "base", "trained", "delta", "ci95"}
    assert all(set(report[k]) == set(METRICS) for k in ("base", "trained", "delta", "ci95"))
    assert (report["n"], report["unpaired"]) == (4, 2)
    # paired in (u1, u2, u3, u4) order; u4's trained session has no preference score, so u4 drops from that metric
    expected = {
        "preference": ([0.5, 2 / 3, 1.0], [1.0, 1.0, 1.0]),
        "task_success": ([0, 1, 0, 0], [1, 1, 1, 1]),
        "user_effort": ([2, 1, 0, 1], [0, 0, 0, 0]),
        "length": ([5, 3, 3, 3], [5, 3, 3, 1]),
    }
    for metric, (base, trained) in expected.items():
        delta, (low, high) = paired_difference(trained, base, resamples=500, seed=3)
        assert report["base"][metric] == pytest.approx(sum(base) / len(base), abs=1e-4)
        assert report["trained"][metric] == pytest.approx(sum(trained) / len(trained), abs=1e-4)
        assert report["delta"][metric] == pytest.approx(delta, abs=1e-4)
        assert report["ci95"][metric] == pytest.approx([low, high], abs=1e-4)
    assert report["delta"]["preference"] == pytest.approx(1 - (0.5 + 2 / 3 + 1) / 3, abs=1e-4)
    assert report["ci95"]["user_effort"][1] < 0  # every pair lost effort: the interval is below 0
    assert report == heldout_report(list(reversed(BASE)), TRAINED, seed=3, resamples=500)  # same seed, same numbers


def test_a_single_pair_gives_a_difference_but_no_interval(tmp_path: Path) -> None:
    report = heldout_report(BASE[:1], TRAINED[3:4], seed=0)
    assert report["n"] == 1 and report["delta"]["task_success"] == 1.0
    assert report["ci95"] == dict.fromkeys(METRICS)
    chart = heldout_chart(report, tmp_path / "heldout.png")
    assert chart is not None and chart.stat().st_size > 0


def test_the_heldout_sessions_are_the_eval_side_of_the_training_split_played_as_trained() -> None:
    stages = load_recipe("collaborator-quickstart").recipe.stages
    training, stage = stages["collab"], stages["heldout"]
    assert isinstance(training, STAGES["collab"])
    cfg = heldout_config(training, users=stage.users, sessions=stage.sessions, workers=stage.workers)
    assert (cfg.split, cfg.agent.value, cfg.max_turns, cfg.simulator) == ("eval", "oracle", 2, "rule")
    assert (cfg.sampling.agent.temperature, cfg.sampling.agent.max_tokens) == (0.0, training.max_turn_tokens)
    assert (cfg.users, cfg.sessions) == (stage.users, stage.sessions)
    assert (cfg.reply, cfg.preferences) == ("text", training.env.preferences)  # prompted and drawn as in training
    trained_on = [json.loads(row) for row in episode_rows(training.env)]
    users, problems = select_profiles(cfg), select_problems(cfg)
    assert len(users) == stage.users
    assert all(set(u.preferences) <= set(training.env.preferences or ()) for u in users)
    assert not {u.id for u in users} & {r["profile"]["id"] for r in trained_on}
    assert not {p.id for p in problems} & {r["problem"]["id"] for r in trained_on}
    assert not {p.question for p in problems} & {r["problem"]["question"] for r in trained_on}


def test_merge_report_keeps_what_other_stages_wrote(tmp_path: Path) -> None:
    (tmp_path / "report.json").write_text(json.dumps({"held_out": {"base": 1}, "heldout": {"n": 0}}))
    merge_report(tmp_path, {"heldout": {"n": 4}})
    assert json.loads((tmp_path / "report.json").read_text()) == {"held_out": {"base": 1}, "heldout": {"n": 4}}


def test_sessions_of_earlier_weights_are_played_again(tmp_path: Path) -> None:
    """A retrain into the same export folder keeps the path but not the weights: its held-out sessions are stale."""
    import os

    model, out = tmp_path / "export", tmp_path / "heldout" / "trained"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    forget_if_retrained(out, str(model), Console(quiet=True), "heldout")
    (out / "sessions.jsonl").write_text("{}\n")
    forget_if_retrained(out, str(model), Console(quiet=True), "heldout")  # same weights: a rerun resumes
    assert (out / "sessions.jsonl").is_file()
    later = (model / "model.safetensors").stat().st_mtime_ns + 10**9
    os.utime(model / "model.safetensors", ns=(later, later))
    forget_if_retrained(out, str(model), Console(quiet=True), "heldout")
    assert not (out / "sessions.jsonl").exists() and (out / "model.json").is_file()
