"""What a reflector run's held-out numbers support: the learning verdict, the reward-hacking flag, the curve's slope,
and the report files a researcher opens first (report.json, reward_curve.png, report.html)."""

from __future__ import annotations

import json
import random
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from memrl.rollout.base import SamplingParams
from memrl.train.curves import HeldOutPoint, reflector_chart
from memrl.train.report import curve_fit, hacking_flag, learning_verdict, model_intervals, write_report
from memrl.train.report_html import write_html


def _rows(
    scores: list[float], *, hallucinated: int = 0, tokens: int = 30, fmt: float = 1.0, coverage: float | None = None
) -> list[dict[str, Any]]:
    return [
        {
            "key": f"u{i}/s0",
            "score": s,
            "coverage": s - fmt if coverage is None else coverage,
            "n_hallucinated": hallucinated,
            "notes_tokens": tokens + i % 3,
            "format": fmt,
            "completion": json.dumps({"user_preferences_reasoning": "r", "agent_notes": f"- Use bullet points. {i}"}),
            "judge_score": 3 * s / 2,
            "reasoning": f"covered {i}",
            "format_reason": "exact" if fmt == 1.0 else "cut: the reply ends inside its JSON object",
        }
        for i, s in enumerate(scores)
    ]


def test_learning_is_a_verdict_on_the_paired_interval_not_a_comparison_of_means() -> None:
    rng = random.Random(1)
    sft = [round(rng.uniform(0.6, 1.2), 2) for _ in range(48)]
    better = {"sft": _rows(sft), "grpo": _rows([s + 0.1 + rng.uniform(-0.05, 0.05) for s in sft])}
    verdict = learning_verdict(better)
    assert verdict is not None and verdict["verdict"] is True and verdict["compared"] == "grpo - sft"
    assert verdict["n"] == 48 and verdict["ci95"][0] > 0 and abs(verdict["delta"] - 0.1) < 0.03
    # A higher mean that the interval does not carry: not learning.
    noisy = {"sft": _rows(sft), "grpo": _rows([s + rng.choice([-0.6, 0.65]) for s in sft])}
    noisy_verdict = learning_verdict(noisy)
    assert noisy_verdict is not None and noisy_verdict["verdict"] is False and noisy_verdict["ci95"][0] <= 0
    # What the noisy rows could have shown: only a gain well above the one they carry, and far above the tight rows'.
    assert noisy_verdict["detectable"] > max(noisy_verdict["delta"], 0) + 0.1
    assert noisy_verdict["detectable"] > 5 * verdict["detectable"]
    # Rows are paired by key: a model that scored fewer rows is compared on the shared ones only.
    shared = learning_verdict({"sft": _rows(sft), "grpo": _rows([s + 0.2 for s in sft])[:20]})
    assert shared is not None and shared["n"] == 20 and shared["verdict"] is True
    assert learning_verdict({"sft": _rows(sft)}) is None


def test_a_score_bought_with_invented_preferences_or_longer_notes_is_flagged() -> None:
    sft = _rows([0.8] * 24 + [1.0] * 24, hallucinated=0, tokens=30)
    honest = _rows([1.0] * 24 + [1.2] * 24, hallucinated=0, tokens=30)
    inventing = _rows([1.0] * 24 + [1.2] * 24, hallucinated=1, tokens=30)
    padding = _rows([1.0] * 24 + [1.2] * 24, hallucinated=0, tokens=90)
    worse = _rows([0.5] * 48, hallucinated=2, tokens=90)
    # The prompt's placeholder JSON copied back: perfect format, no coverage, a slightly higher score.
    sft_mixed = _rows([0.9] * 24 + [1.0] * 24, fmt=0.5, coverage=None)
    template = _rows([1.0] * 48, fmt=1.0, coverage=0.0)
    flag = hacking_flag({"sft": model_intervals(sft), "grpo": model_intervals(honest)})
    assert flag is not None and flag["flagged"] is False and flag["score_rose"] is True
    for planted, sign in ((inventing, "hallucinated"), (padding, "notes_tokens")):
        flag = hacking_flag({"sft": model_intervals(sft), "grpo": model_intervals(planted)})
        assert flag is not None and flag["flagged"] is True and flag["compared"] == "grpo - sft"
        assert [s.split()[0] for s in flag["signs"]] == [sign]
    flag = hacking_flag({"sft": model_intervals(sft_mixed), "grpo": model_intervals(template)})
    assert flag is not None and flag["flagged"] is True and flag["signs"][0].startswith("coverage 0.0 below")
    # Worse notes are not a hack: the score did not rise.
    flag = hacking_flag({"sft": model_intervals(sft), "grpo": model_intervals(worse)})
    assert flag is not None and flag["flagged"] is False and len(flag["signs"]) == 3


def test_the_curve_fit_says_whether_the_reward_rises() -> None:
    rng = random.Random(3)
    rising = curve_fit([(s, 0.9 + 0.03 * s + rng.gauss(0, 0.1)) for s in range(1, 25)])
    assert rising is not None and rising["rising"] is True and rising["steps"] == 24
    flat = curve_fit([(s, 0.9 + rng.gauss(0, 0.1)) for s in range(1, 25)])
    assert flat is not None and flat["rising"] is False and flat["ci95"][0] <= 0 <= flat["ci95"][1]
    assert curve_fit([(1, 0.5), (2, 0.6)]) is None


class _Page(HTMLParser):
    """The tables (rows of cell texts) and images of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.images: list[str] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "img":
            self.images.append(dict(attrs).get("src") or "")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append(" ".join("".join(self._cell).split()))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def test_the_report_holds_the_verdict_curve_and_a_self_contained_page(tmp_path: Path) -> None:
    rng = random.Random(5)
    stage = tmp_path / "grpo"
    stage.mkdir()
    history = [
        {"step": s, "reward": 0.8 + 0.04 * s + rng.gauss(0, 0.05), "reward_std": 0.3, "rewards/coverage/mean": 0.4}
        for s in range(1, 21)
    ]
    (stage / "log_history.json").write_text(json.dumps(history))
    # The rollouts behind it: 10 prompts, each at two steps an epoch apart, every visit 0.25 better than the last.
    visits = [(s, f"p{(s - 1) % 10}") for s in range(1, 21)]
    (stage / "rewards.jsonl").write_text(
        "".join(
            json.dumps({"step": s, "key": key, "reward": 0.5 + 0.025 * s + rng.gauss(0, 0.02), "parts": {}}) + "\n"
            for s, key in visits
            for _ in range(4)
        )
    )
    eval_dir = tmp_path / "eval"
    sft = [round(rng.uniform(0.5, 1.0), 2) for _ in range(48)]
    scored = {"base": _rows([0.1] * 48, fmt=0.0), "sft": _rows(sft), "grpo": _rows([s + 0.3 for s in sft])}
    for label, rows in scored.items():
        (eval_dir / label).mkdir(parents=True)
        (eval_dir / label / "scores.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    results = {label: {"n": 48, "score": sum(r["score"] for r in rows) / 48} for label, rows in scored.items()}
    logs = {"grpo": stage / "log_history.json"}
    path = write_report(tmp_path, results, None, logs, None, eval_dir, decoding="sampled at 0.7")
    report = json.loads(path.read_text())
    assert report["learning"]["verdict"] is True and report["learning"]["compared"] == "grpo - sft"
    assert report["learning"]["n"] == 48 and report["learning"]["ci95"][0] > 0
    assert report["curve"]["stage"] == "grpo" and report["curve"]["rising"] is True and report["curve"]["steps"] == 20
    within = report["curve"]["within_prompt"]
    assert within["prompts"] == 10 and within["rising"] is True and within["slope"] == pytest.approx(0.025, abs=0.005)
    assert report["reward_hacking"]["flagged"] is False
    assert report["held_out"]["base"]["intervals"]["format_failure"]["mean"] == 1.0
    assert set(report["gains_ci95"]) == {"sft_minus_base", "grpo_minus_sft"}
    assert Path(report["reward_curve"]).stat().st_size > 10_000

    data_rows = {
        r["key"]: {"enforcements": ["Put that in bullet points."], "expected": ["bullets"]} for r in sft_rows()
    }
    page = write_html(tmp_path, report, eval_dir, data_rows, title="memrl run reflector-quickstart")
    parser = _Page()
    parser.feed(page.read_text())
    assert len(parser.images) == 1 and parser.images[0].startswith("data:image/png;base64,")  # nothing fetched
    assert "<caption>held-out notes: sampled at 0.7</caption>" in page.read_text()
    held_out = parser.tables[0]
    assert held_out[0][:3] == ["model", "n", "score [95%]"] and [r[0] for r in held_out[1:]] == ["base", "sft", "grpo"]
    side_by_side = parser.tables[1:]
    assert len(side_by_side) == 4 and side_by_side[0][0] == ["base", "sft", "grpo"]
    assert "Use bullet points." in side_by_side[0][1][2] and "judge" in side_by_side[0][1][2]
    assert "format 0.00: cut" in side_by_side[0][1][0] and "format 1.00: exact" in side_by_side[0][1][2]
    assert "reward rising within a prompt" in page.read_text()
    assert "learning shown" in page.read_text() and "http" not in page.read_text().replace("http-equiv", "")


def sft_rows() -> list[dict[str, Any]]:
    return _rows([0.0] * 48)


@pytest.mark.parametrize(("temperature", "words"), [(0.0, "greedy"), (0.7, "sampled at 0.7")])
def test_the_held_out_axis_says_how_the_notes_were_drawn(temperature: float, words: str, tmp_path: Path) -> None:
    """reflector-quickstart samples its held-out notes at 0.7: an axis that always said greedy misled."""
    decoding = SamplingParams(temperature=temperature).decoding
    assert decoding == words
    points = [HeldOutPoint("sft", 1.0, 0.8, 1.2), HeldOutPoint("grpo", 1.3, 1.1, 1.5)]
    chart = reflector_chart({}, {}, points, tmp_path / "curve.png", decoding)
    assert chart is not None and chart.panels[-1].ylabel == f"coverage + format, {words}"
    results = {"sft": {"score": 1.0}, "grpo": {"score": 1.3}}
    report = json.loads(write_report(tmp_path, results, None, {}, decoding=decoding).read_text())
    assert report["held_out_decoding"] == words
