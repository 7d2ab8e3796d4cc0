"""The run's report (`report.json`): held-out reward of every evaluated model with intervals, the learning verdict,
the reward-hacking flag, and the GRPO reward curve with its slope (TRL and verl stages).

What the numbers support are pure functions of per-row records: per model its scores with intervals
(`model_intervals`), the learning verdict (the trained model minus the one it started from, paired over held-out
rows: `learning_verdict`), the reward-hacking flag (`hacking_flag`) and the curve's slope (`curve_fit`)."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from memrl.core.errors import MemrlError
from memrl.core.files import read_json, read_jsonl
from memrl.core.stats import (
    detectable_effect,
    mean_interval,
    paired_difference,
    slope_interval,
    within_slope_interval,
)
from memrl.train.curves import TRAIN_REWARD, HeldOutPoint, RewardStep, reflector_chart
from memrl.train.trl.common import REWARDS_FILES
from memrl.train.verl import metrics as verl_metrics
from memrl.train.verl.metrics import METRICS_FILE

REPORT_FILE = "report.json"
CURVE_FILE = "reward_curve.png"
SCORES = "scores.jsonl"  # per held-out row of a model, as train/evaluate.py writes it
TRAIN_REWARD_MIN, TRAIN_REWARD_MAX = "critic/score/min", "critic/score/max"
Row = Mapping[str, Any]  # one held-out session's reflection as `eval/<label>/scores.jsonl` holds it

# Per model: what each held-out reply contributes to the mean that is reported with its interval (a session with
# several draws contributes their mean: `session_measure`).
MEASURES: dict[str, Any] = {
    "score": lambda r: math.nan if r.get("score") is None else float(r["score"]),
    "coverage": lambda r: math.nan if r.get("coverage") is None else float(r["coverage"]),
    "hallucinated": lambda r: math.nan if r.get("n_hallucinated") is None else float(r["n_hallucinated"]),
    "notes_tokens": lambda r: float(r.get("notes_tokens") or 0),
    "format_failure": lambda r: float(r.get("format") == 0.0),
}


def session_measure(row: Row, measure: str) -> float:
    """`measure` of one held-out session: the mean over its draws (`draws`, when the eval stage drew more than one
    note per session) of those that have it; NaN when none does (a judge that failed on every draw)."""
    values = [v for d in row.get("draws", [row]) if not math.isnan(v := MEASURES[measure](d))]
    return math.fsum(values) / len(values) if values else math.nan


# Measures a reward hacker moves while its score rises: up, more invented preferences, longer notes, broken replies;
# down, coverage (a score bought with the format alone, e.g. the prompt's placeholder JSON copied back).
HACKING_SIGNS = {"hallucinated": "up", "notes_tokens": "up", "format_failure": "up", "coverage": "down"}


def _rounded(found: tuple[float, tuple[float, float]] | None) -> tuple[float | None, list[float] | None]:
    if found is None:
        return None, None
    return round(found[0], 4), [round(found[1][0], 4), round(found[1][1], 4)]


def model_intervals(rows: Sequence[Row], *, seed: int = 0) -> dict[str, Any]:
    """Each measure's mean over the rows and its bootstrap 95% interval: `{measure: {"mean", "ci95"}}`."""
    out: dict[str, Any] = {}
    for name in MEASURES:
        mean, interval = _rounded(mean_interval([session_measure(r, name) for r in rows], seed=seed))
        out[name] = {"mean": mean, "ci95": interval}
    return out


def _paired(after: Sequence[Row], before: Sequence[Row], measure: str, seed: int) -> tuple[int, Any]:
    mine, theirs = paired_measures(after, before, measure)
    return len(mine), paired_difference(mine, theirs, seed=seed)


def paired_measures(after: Sequence[Row], before: Sequence[Row], measure: str) -> tuple[list[float], list[float]]:
    """`measure` of the rows both models scored, in the same key order."""
    mine = {r["key"]: session_measure(r, measure) for r in after}
    theirs = {r["key"]: session_measure(r, measure) for r in before}
    keys = sorted(mine.keys() & theirs.keys())
    return [mine[k] for k in keys], [theirs[k] for k in keys]


def learning_verdict(rows: Mapping[str, Sequence[Row]], *, seed: int = 0) -> dict[str, Any] | None:
    """The last model listed against the one before it (`grpo - sft` in the quickstart), paired over the held-out
    rows both scored: `verdict` is true only when the interval of the difference lies above 0. `detectable`: the
    smallest true gain these rows would show 4 times in 5 (`memrl.core.stats.detectable_effect`)."""
    labels = list(rows)
    if len(labels) < 2:
        return None
    after, before = labels[-1], labels[-2]
    mine, theirs = paired_measures(rows[after], rows[before], "score")
    delta, interval = _rounded(paired_difference(mine, theirs, seed=seed))
    detectable = detectable_effect([a - b for a, b in zip(mine, theirs, strict=True)])
    return {
        "verdict": interval is not None and interval[0] > 0,
        "compared": f"{after} - {before}",
        "n": len(mine),
        "delta": delta,
        "ci95": interval,
        "detectable": None if detectable is None else round(detectable, 4),
    }


def gains(rows: Mapping[str, Sequence[Row]], *, seed: int = 0) -> dict[str, Any]:
    """Each model's held-out score minus the previous one's, paired over rows, with its interval."""
    labels = list(rows)
    out: dict[str, Any] = {}
    for before, after in itertools.pairwise(labels):
        n, found = _paired(rows[after], rows[before], "score", seed)
        delta, interval = _rounded(found)
        out[f"{after}_minus_{before}"] = {"n": n, "delta": delta, "ci95": interval}
    return out


def hacking_flag(intervals: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """The last model against the one before it: flagged when its score rose while a hacking sign's mean left the
    earlier model's interval the wrong way (up: invented preferences per note, note length, format failures; down:
    coverage)."""
    labels = list(intervals)
    if len(labels) < 2:
        return None
    after, before = intervals[labels[-1]], intervals[labels[-2]]
    compared = f"{labels[-1]} - {labels[-2]}"
    rose = (after["score"]["mean"] or 0.0) > (before["score"]["mean"] or 0.0)
    signs = []
    for sign, way in HACKING_SIGNS.items():
        mean, interval = after[sign]["mean"], before[sign]["ci95"]
        if mean is None or interval is None:
            continue
        if (way == "up" and mean > interval[1]) or (way == "down" and mean < interval[0]):
            side = "above" if way == "up" else "below"
            signs.append(f"{sign} {mean} {side} {labels[-2]}'s interval {interval}")
    return {"flagged": rose and bool(signs), "compared": compared, "score_rose": rose, "signs": signs}


def curve_fit(
    points: Sequence[tuple[float, float]],
    prompts: Mapping[str, Sequence[tuple[float, float]]] | None = None,
    *,
    seed: int = 0,
) -> dict[str, Any] | None:
    """The least-squares slope of the per-step mean training reward, with a bootstrap interval over steps; with
    `prompts` (each training prompt's rollout rewards as (step, reward)), also `within_prompt`: the slope with an
    intercept per prompt, from the prompts trained at more than one step, its interval a bootstrap over prompts. The
    per-step mean moves with which prompts a step drew; within a prompt, only with the policy."""
    found = slope_interval([x for x, _ in points], [y for _, y in points], seed=seed)
    if found is None:
        return None
    slope, interval = found
    within = within_slope_interval(prompts or {}, seed=seed)
    return {
        "slope": round(slope, 5),
        "ci95": _rounded_interval(interval),
        "steps": len(points),
        "rising": interval[0] > 0,
        "within_prompt": None
        if within is None
        else {
            "slope": round(within[0], 5),
            "ci95": _rounded_interval(within[1]),
            "prompts": within[2],
            "rising": within[1][0] > 0,
        },
    }


def _rounded_interval(interval: tuple[float, float]) -> list[float]:
    return [round(interval[0], 5), round(interval[1], 5)]


def prompt_rewards(stage_dir: Path) -> dict[str, list[tuple[float, float]]]:
    """Each training prompt's scored rollouts as (step, reward), from a TRL GRPO stage's reward logs; empty where
    the stage kept none (verl stages, runs of older versions)."""
    groups: dict[str, list[tuple[float, float]]] = {}
    for path in sorted(stage_dir.glob(REWARDS_FILES)):
        for row in read_jsonl(path):
            if row.get("key") is not None and isinstance(row.get("reward"), int | float):
                groups.setdefault(str(row["key"]), []).append((float(row["step"]), float(row["reward"])))
    return groups


def grpo_steps(logs: dict[str, Path]) -> dict[str, list[RewardStep]]:
    """Per GRPO stage its reward per step: TRL stages from their `log_history.json`, verl stages from their file
    logger's metrics (`verl_metrics.jsonl`)."""
    return {name: _verl_steps(path) if path.name == METRICS_FILE else _trl_steps(path) for name, path in logs.items()}


def _trl_steps(path: Path) -> list[RewardStep]:
    rows = {int(r["step"]): r for r in json.loads(path.read_text()) if "reward" in r}
    steps = []
    for step, r in sorted(rows.items()):
        mean, std = float(r["reward"]), r.get("reward_std")
        parts = {
            key.removeprefix("rewards/").removesuffix("/mean"): float(value)
            for key, value in r.items()
            if key.startswith("rewards/") and key.endswith("/mean") and value is not None
        }
        low, high = (None, None) if std is None else (mean - float(std), mean + float(std))
        steps.append(RewardStep(float(step), mean, low, high, parts=parts))
    return steps


def _verl_steps(path: Path) -> list[RewardStep]:
    """verl logs the reward's parts for validation steps only: the train reward with its min..max here."""
    steps = verl_metrics.read(path.parent)
    return [
        RewardStep(float(s), r[TRAIN_REWARD], r.get(TRAIN_REWARD_MIN), r.get(TRAIN_REWARD_MAX))
        for s, r in steps.items()
        if TRAIN_REWARD in r
    ]


def grpo_logs(run_dir: Path, trl_logs: dict[str, Path]) -> dict[str, Path]:
    """The TRL stages' logs and, for each other stage folder of the run, verl's metrics if it logged a reward."""
    found = dict(trl_logs)
    for path in sorted(run_dir.glob(f"*/{METRICS_FILE}")):
        if path.parent.name not in found and any(TRAIN_REWARD in r for r in verl_metrics.read(path.parent).values()):
            found[path.parent.name] = path
    return found


def held_out_rows(eval_dir: Path, labels: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """Each model's scored held-out reflections (`<eval>/<label>/scores.jsonl`), where written."""
    rows = {}
    for label in labels:
        path = eval_dir / label / SCORES
        if path.is_file():
            rows[label] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


def write_report(
    run_dir: Path,
    results: dict[str, dict[str, Any]],
    online: dict[str, Any] | None,
    trl_logs: dict[str, Path],
    outcome: dict[str, Any] | None = None,
    eval_dir: Path | None = None,
    *,
    seed: int = 0,
    decoding: str | None = None,
) -> Path:
    """`report.json`: per model label its held-out metrics (with `intervals` where the rows are in `eval_dir`), each
    label's score gain over the one before, the learning verdict (the last label against the one before, paired
    over rows), the reward-hacking flag, the GRPO curve's slope and `reward_curve.png`; `decoding` (how the held-out
    notes were drawn) goes on the chart's axis and into `held_out_decoding`; with `outcome`
    (train/rewards/next_session_eval.py), the next-session evaluation of the held-out notes."""
    labels = list(results)
    rows = held_out_rows(eval_dir, labels) if eval_dir is not None else {}
    for label, lines in rows.items():
        results[label]["intervals"] = model_intervals(lines, seed=seed)
    paired = {label: rows[label] for label in labels if label in rows}
    logs = grpo_logs(run_dir, trl_logs)
    steps = grpo_steps(logs)
    fits = {
        name: fit
        for name, points in steps.items()
        if (fit := curve_fit([(s.step, s.mean) for s in points], prompt_rewards(logs[name].parent), seed=seed))
    }
    points = [
        HeldOutPoint(label, r["intervals"]["score"]["mean"], *r["intervals"]["score"]["ci95"])
        for label, r in results.items()
        if r.get("intervals", {}).get("score", {}).get("ci95")
    ]
    chart = reflector_chart(steps, fits, points, run_dir / CURVE_FILE, decoding)
    last_fit = next(((name, fit) for name, fit in reversed(fits.items())), None)
    report = {
        "held_out": results,
        "held_out_decoding": decoding,
        "mean_reward": {label: results[label].get("score") for label in labels},
        "gains": {
            f"{after}_minus_{before}": _diff(results[after].get("score"), results[before].get("score"))
            for before, after in itertools.pairwise(labels)
        },
        "gains_ci95": {name: g["ci95"] for name, g in gains(paired, seed=seed).items()},
        "learning": learning_verdict(paired, seed=seed),
        "reward_hacking": hacking_flag({label: r["intervals"] for label, r in results.items() if "intervals" in r}),
        "curve": None if last_fit is None else {"stage": last_fit[0], **last_fit[1]},
        "online": online,
        "reward_curve": str(chart.path) if chart else None,
    }
    if outcome is not None:
        report["outcome"] = outcome
    return merge_report(run_dir, report)


def merge_report(run_dir: Path, sections: dict[str, Any]) -> Path:
    """Write `sections` into the run's `report.json`, keeping the keys other stages wrote there."""
    path = run_dir / REPORT_FILE
    report = read_json(path, MemrlError) if path.is_file() else {}
    if not isinstance(report, dict):
        raise MemrlError(f"{path}: not a JSON object; delete it and rerun the stages that write it")
    path.write_text(json.dumps(report | sections, indent=2))
    return path


def _diff(a: float | None, b: float | None) -> float | None:
    return round(a - b, 4) if a is not None and b is not None else None
