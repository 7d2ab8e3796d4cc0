"""The held-out next-session evaluation of reflectors (the eval stage's `report.json` `outcome`).

`outcome_report` plays the eval stage's held-out rows with oracle, empty and wrong notes first (can the note reader
tell them apart?) and with each model's notes, and gives `report.json`'s `outcome`: the calibration, each model's
pass rate, the paired differences, a ranking only when the calibration allows one, and the rank correlation of the
coverage judge with the outcome reward.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import fmean
from typing import Any

from scipy.stats import spearmanr

from memrl.core.asyncs import run_sync
from memrl.core.errors import ConfigError
from memrl.core.files import read_jsonl
from memrl.core.stats import paired_difference
from memrl.envs.collab.agents import oracle_notes
from memrl.envs.collab.next_session import NextSessionRow, load_rows, wrong_preferences
from memrl.rewards.config import NextSessionRewardConfig
from memrl.rewards.format import extract_notes
from memrl.train.rewards.next_session import NextSessionScorer, OutcomeParts, build_scorer

SCORES_FILE = "outcome_scores.jsonl"
CALIBRATION_FILE = "calibration_scores.jsonl"


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation (ties share their average rank); None with fewer than 3 pairs or a constant
    side."""
    if len(xs) != len(ys):
        raise ValueError(f"{len(xs)} values against {len(ys)}")
    if len(xs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    return round(float(spearmanr(xs, ys).statistic), 4)


CALIBRATION = ("oracle", "empty", "wrong")  # the notes every reflector's score is calibrated against


def calibration_notes(row: NextSessionRow) -> dict[str, str]:
    """The row user's true preferences as notes, no notes, and notes of preferences it does not hold."""
    wrong = oracle_notes(wrong_preferences(row.user_id, row.preferences))
    return {"oracle": oracle_notes(row.preferences), "empty": "", "wrong": wrong}


def by_user(rows: Sequence[NextSessionRow], rates: Sequence[float | None]) -> dict[str, float]:
    """Pass rates keyed by the rows' users, the bootstrap's units (NaN: the session failed)."""
    return {row.user_id: math.nan if rate is None else rate for row, rate in zip(rows, rates, strict=True)}


def rank_reflectors(
    units: Mapping[str, Mapping[str, float]], labels: Sequence[str], *, seed: int = 0, resamples: int = 2000
) -> dict[str, Any]:
    """`report.json`'s `outcome` from next-session pass rates per unit (`units[kind][unit]`, kinds oracle, empty,
    wrong and each model label): the calibration (oracle and wrong notes against empty ones, paired bootstrap over
    the units), each model's pass rate and its difference from the first model's. Models are ranked only when
    `can_rank`: the oracle - empty interval lies above 0, i.e. the note reader does better with true notes."""
    missing = [k for k in (*CALIBRATION, *labels) if k not in units]
    if missing:
        raise ValueError(f"rank_reflectors: no pass rates for {missing}")
    shared = sorted(set.intersection(*(set(units[k]) for k in (*CALIBRATION, *labels))))

    def rate(kind: str) -> float | None:
        values = [units[kind][u] for u in shared if not math.isnan(units[kind][u])]
        return round(fmean(values), 4) if values else None

    def diff(a: str, b: str) -> tuple[float | None, list[float] | None]:
        found = paired_difference(
            [units[a][u] for u in shared], [units[b][u] for u in shared], resamples=resamples, seed=seed
        )
        return (None, None) if found is None else (round(found[0], 4), [round(x, 4) for x in found[1]])

    calibration: dict[str, Any] = {kind: rate(kind) for kind in CALIBRATION}
    found = {f"{kind}_minus_empty": diff(kind, "empty") for kind in ("oracle", "wrong")}
    calibration |= {name: delta for name, (delta, _) in found.items()}
    calibration["ci95"] = {name: interval for name, (_, interval) in found.items()}
    interval = calibration["ci95"]["oracle_minus_empty"]
    calibration["can_rank"] = interval is not None and interval[0] > 0
    out: dict[str, Any] = {"n": len(shared), "calibration": calibration, "pass_rate": {k: rate(k) for k in labels}}
    gains = {f"{label}_minus_{labels[0]}": diff(label, labels[0]) for label in labels[1:]}
    out |= {name: delta for name, (delta, _) in gains.items()}
    out["ci95"] = {name: interval for name, (_, interval) in gains.items()}
    gap = f"oracle - empty {calibration['oracle_minus_empty']}, 95% interval {interval}"
    if calibration["can_rank"]:
        rates = out["pass_rate"]
        out["ranking"] = sorted(labels, key=lambda k: (rates[k] is None, -(rates[k] or 0.0)))  # best first
        out["verdict"] = f"the signal can rank reflectors ({gap}, above 0)"
    else:
        out["ranking"] = None
        why = "fewer than two units" if interval is None else "not above 0"
        out["verdict"] = f"the signal cannot rank reflectors: {gap}, {why}"
    return out


def outcome_report(
    cfg: NextSessionRewardConfig,
    data: Path,
    eval_dir: Path,
    labels: Sequence[str],
    plain_text_notes: bool = False,
    scorer: NextSessionScorer | None = None,
    *,
    users: int | None = None,
    resamples: int = 2000,
) -> dict[str, Any]:
    """The next-session evaluation of the held-out reflections in `eval_dir/<label>/scores.jsonl`: for the first
    row of each held-out user (the first `users` of them), the calibration's oracle, empty and wrong notes and every
    model's notes, all sessions in one lock-step batch. One row per user: users are the bootstrap's units, and a
    user's second row would cost as much as a new user while telling less. Writes `<label>/outcome_scores.jsonl`
    and `calibration_scores.jsonl`; returns `rank_reflectors`' section, the judge's agreement (`outcome_agreement`)
    and what it cost."""
    started = time.monotonic()
    rows = load_rows(cfg.data or (data if data.is_dir() else data.parent.parent))
    scored = {label: read_jsonl(eval_dir / label / "scores.jsonl", ConfigError) for label in labels}
    keys = list(dict.fromkeys(line["key"] for label in labels for line in scored[label]))
    if unknown := [k for k in keys if k not in rows]:
        raise ConfigError(f"outcome evaluation: {len(unknown)} eval keys are not in the reflection data: {unknown[0]}")
    first = {rows[k].user_id: k for k in reversed(keys)}  # each user's first row, in the eval order
    held_out = [rows[k] for k in sorted(first.values(), key=keys.index)][:users]
    chosen = {row.key for row in held_out}
    scored = {label: [line for line in lines if line["key"] in chosen] for label, lines in scored.items()}
    calibration = [(calibration_notes(row)[kind], row) for row in held_out for kind in CALIBRATION]
    models = [
        (_notes(line["completion"], plain_text_notes), rows[line["key"]]) for ls in scored.values() for line in ls
    ]
    own = scorer is None
    scorer = build_scorer(cfg) if scorer is None else scorer
    try:
        parts = run_sync(scorer.ascore([*calibration, *models]))
        stats = scorer.stats()
    finally:
        if own:
            scorer.close()
    by_kind = {kind: parts[i : len(calibration) : len(CALIBRATION)] for i, kind in enumerate(CALIBRATION)}
    (eval_dir / CALIBRATION_FILE).write_text(
        "".join(
            json.dumps({"key": row.key, "user_id": row.user_id} | {k: by_kind[k][n].with_notes for k in CALIBRATION})
            + "\n"
            for n, row in enumerate(held_out)
        )
    )
    units = {kind: by_user(held_out, [p.with_notes for p in by_kind[kind]]) for kind in CALIBRATION}
    at = len(calibration)
    mine: dict[str, list[OutcomeParts]] = {}
    for label in labels:
        mine[label] = parts[at : at + len(scored[label])]
        at += len(scored[label])
        (eval_dir / label / SCORES_FILE).write_text(
            "".join(
                json.dumps({"key": ln["key"], **p.to_dict()}) + "\n"
                for ln, p in zip(scored[label], mine[label], strict=True)
            )
        )
        units[label] = by_user([rows[ln["key"]] for ln in scored[label]], [p.with_notes for p in mine[label]])
    report = rank_reflectors(units, labels, seed=cfg.seed, resamples=resamples)
    return report | {
        "agent": cfg.reader,
        "reader": cfg.reader,
        "max_turns": cfg.max_turns,
        "unit": "user (the first held-out row of each)",
        "outcome_agreement": _agreement(scored, mine),
        "sessions": stats["sessions"],
        "failures": sum(p.failed for p in parts),
        "seconds": round(time.monotonic() - started, 1),
    }


def _agreement(scored: Mapping[str, list[dict[str, Any]]], parts: Mapping[str, list[OutcomeParts]]) -> dict[str, Any]:
    """Spearman's correlation of the outcome reward (with notes - without) with the judge's coverage, pooled over
    the models' held-out reflections and per model."""
    out: dict[str, Any] = {"by_model": {}}
    pooled: list[tuple[float, float]] = []
    for label, lines in scored.items():
        both = [
            (p.score, float(ln["coverage"]))
            for ln, p in zip(lines, parts[label], strict=True)
            if p.score is not None and ln.get("coverage") is not None
        ]
        pooled += both
        out["by_model"][label] = {
            "n": len(both),
            "outcome": round(fmean(o for o, _ in both), 4) if both else None,
            "spearman": spearman([o for o, _ in both], [c for _, c in both]),
        }
    return out | {
        "spearman_outcome_vs_coverage": spearman([o for o, _ in pooled], [c for _, c in pooled]),
        "n": len(pooled),
    }


def _notes(completion: str, plain_text_notes: bool) -> str:
    """What the agent would store, as the judge reward reads it (no notes: "")."""
    notes = extract_notes(completion)
    if notes is not None:
        return notes
    return completion.strip() if plain_text_notes else ""
