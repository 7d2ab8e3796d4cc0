"""The next-session outcome reward in the reflector's trainers: TRL reward functions and the held-out agreement.

`grpo_rewards` is what the TRL GRPO stage hands GRPOTrainer: the judge reward's functions and weights, plus the
outcome function and its weight when the stage's reward has an `outcome` block. `outcome_agreement` scores the
eval stage's held-out reflections with the outcome reward and reports its rank correlation with the coverage judge
(for `report.json`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from statistics import fmean
from typing import Any

from scipy.stats import spearmanr

from memrl.envs.collab.next_session import NextSessionScorer, build_scorer, load_rows
from memrl.envs.collab.outcome_trl import outcome_reward_func
from memrl.rewards.config import OutcomeRewardConfig, RewardConfig
from memrl.rewards.format import extract_notes
from memrl.rewards.reward import run_sync
from memrl.rewards.trl_reward import RewardFunc, reward_funcs, reward_weights
from memrl.rewards.unscored import UnscoredWatch

SCORES_FILE = "outcome_scores.jsonl"


def grpo_rewards(
    reward: RewardConfig, data_dir: Path, watch: UnscoredWatch | None = None
) -> tuple[list[RewardFunc], list[float]]:
    """(reward_funcs, reward_weights) for GRPOTrainer; the outcome's rows come from `outcome.data` or `data_dir`;
    `watch` stops the run when the judge keeps failing."""
    funcs, weights = [*reward_funcs(reward, watch=watch)], reward_weights(reward)
    if reward.outcome is None:
        return funcs, weights
    rows = load_rows(reward.outcome.data or data_dir)
    return [*funcs, outcome_reward_func(build_scorer(reward.outcome), rows)], [*weights, reward.outcome.weight]


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation (ties share their average rank); None with fewer than 3 pairs or a constant
    side."""
    if len(xs) != len(ys):
        raise ValueError(f"{len(xs)} values against {len(ys)}")
    if len(xs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    return round(float(spearmanr(xs, ys).statistic), 4)


def outcome_agreement(
    cfg: OutcomeRewardConfig,
    data: Path,
    eval_dir: Path,
    labels: Sequence[str],
    plain_text_notes: bool = False,
    scorer: NextSessionScorer | None = None,
) -> dict[str, Any]:
    """Outcome reward of every held-out reflection in `eval_dir/<label>/scores.jsonl` (written to
    `<label>/outcome_scores.jsonl`) and its Spearman correlation with the judge's coverage, pooled and per model."""
    rows = load_rows(cfg.data or (data if data.is_dir() else data.parent.parent))
    scored = {label: _read(eval_dir / label / "scores.jsonl") for label in labels}
    lines = [line for label in labels for line in scored[label]]
    pairs = [(_notes(line["completion"], plain_text_notes), rows[line["key"]]) for line in lines]
    own = scorer is None
    scorer = build_scorer(cfg) if scorer is None else scorer
    try:
        parts = run_sync(scorer.ascore(pairs))
    finally:
        if own:
            scorer.close()
    out: dict[str, Any] = {"by_model": {}}
    pooled: list[tuple[float, float]] = []
    at = 0
    for label, mine_lines in scored.items():
        mine = parts[at : at + len(mine_lines)]
        at += len(mine_lines)
        (eval_dir / label / SCORES_FILE).write_text(
            "".join(
                json.dumps({"key": ln["key"], **p.to_dict()}) + "\n" for ln, p in zip(mine_lines, mine, strict=True)
            )
        )
        both = [
            (p.score, float(ln["coverage"]))
            for ln, p in zip(mine_lines, mine, strict=True)
            if p.score is not None and ln.get("coverage") is not None
        ]
        pooled += both
        out["by_model"][label] = {
            "n": len(both),
            "outcome": round(fmean(o for o, _ in both), 4) if both else None,
            "spearman": spearman([o for o, _ in both], [c for _, c in both]),
        }
    out |= {
        "spearman_outcome_vs_coverage": spearman([o for o, _ in pooled], [c for _, c in pooled]),
        "n": len(pooled),
        "outcome_failures": sum(p.failed for p in parts),
        "sessions": scorer.stats()["sessions"],
    }
    return out


def _notes(completion: str, plain_text_notes: bool) -> str:
    """What the agent would store, as the judge reward reads it (no notes: "")."""
    notes = extract_notes(completion)
    if notes is not None:
        return notes
    return completion.strip() if plain_text_notes else ""


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
