"""`report.html`: the reflector run on one self-contained page (no network): the verdict, the reward curve, the
held-out table with intervals, the next-session outcome, and a few held-out sessions with every model's notes side
by side, the judge's verdict and the reader's outcome under each."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from memrl.rewards.format import extract_notes
from memrl.train.report import session_measure

HTML_FILE = "report.html"
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
.yes { color: #137333; font-weight: bold; } .no { color: #b3261e; font-weight: bold; }
.notes { white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: 0.85em; }
.small { color: #555; font-size: 0.85em; }
img { max-width: 100%; border: 1px solid #ddd; }
"""


def _num(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return f"{value:.{digits}f}" if isinstance(value, float) else str(value)
    return escape(str(value))


def _ci(interval: Sequence[float] | None) -> str:
    return "" if not interval else f" [{interval[0]:.3f}, {interval[1]:.3f}]"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], caption: str = "") -> str:
    cap = f"<caption>{escape(caption)}</caption>" if caption else ""
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table>{cap}<thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _yes(flag: bool | None, yes: str, no: str) -> str:
    return f'<span class="yes">{escape(yes)}</span>' if flag else f'<span class="no">{escape(no)}</span>'


def _verdict(report: Mapping[str, Any]) -> str:
    lines = []
    if learning := report.get("learning"):
        lines.append(
            _yes(learning["verdict"], "learning shown", "learning not shown")
            + f" &mdash; {escape(learning['compared'])} = {_num(learning['delta'])}{_ci(learning['ci95'])}"
            f" over {learning['n']} held-out sessions (paired bootstrap, 95%)"
        )
    if curve := report.get("curve"):
        lines.append(
            _yes(curve["rising"], "reward curve rising", "reward curve not rising")
            + f" &mdash; slope {curve['slope']:+.4f} per step{_ci(curve['ci95'])} over {curve['steps']} steps"
        )
        if within := curve.get("within_prompt"):
            lines.append(
                _yes(within["rising"], "reward rising within a prompt", "reward not rising within a prompt")
                + f" &mdash; slope {within['slope']:+.4f} per step{_ci(within['ci95'])} over {within['prompts']}"
                " prompts trained at more than one step"
            )
    if (hacking := report.get("reward_hacking")) is not None:
        signs = "; ".join(hacking["signs"]) or "none"
        lines.append(
            _yes(not hacking["flagged"], "no sign of reward hacking", "reward hacking flagged")
            + f" &mdash; {escape(hacking['compared'])}: {escape(signs)}"
        )
    if (outcome := report.get("outcome")) is not None:
        lines.append(
            f"next session ({escape(str(outcome.get('reader')))} reads the notes): {escape(outcome['verdict'])}"
        )
    return "<ul>" + "".join(f"<li>{line}</li>" for line in lines) + "</ul>"


def _held_out(results: Mapping[str, Mapping[str, Any]], decoding: str | None) -> str:
    head = [
        "model",
        "n",
        "score [95%]",
        "coverage [95%]",
        "format",
        "invented preferences / note [95%]",
        "notes tokens [95%]",
        "format failures [95%]",
    ]
    rows = []
    for label, r in results.items():
        iv = r.get("intervals", {})

        def cell(measure: str, fallback: Any = None, iv: Mapping[str, Any] = iv) -> str:
            found = iv.get(measure)
            return _num(fallback) if not found else _num(found["mean"]) + _ci(found["ci95"])

        rows.append(
            [
                escape(label),
                _num(r.get("n")),
                cell("score", r.get("score")),
                cell("coverage", r.get("coverage")),
                _num(r.get("format")),
                cell("hallucinated"),
                cell("notes_tokens", r.get("notes_tokens")),
                cell("format_failure"),
            ]
        )
    return _table(head, rows, f"held-out notes: {decoding}" if decoding else "")


def _outcome(outcome: Mapping[str, Any]) -> str:
    cal = outcome["calibration"]
    ci = cal.get("ci95", {})
    calibration = _table(
        ["oracle", "empty", "wrong", "oracle - empty [95%]", "wrong - empty [95%]", "can rank"],
        [
            [
                _num(cal["oracle"]),
                _num(cal["empty"]),
                _num(cal["wrong"]),
                _num(cal["oracle_minus_empty"]) + _ci(ci.get("oracle_minus_empty")),
                _num(cal["wrong_minus_empty"]) + _ci(ci.get("wrong_minus_empty")),
                _yes(cal["can_rank"], "yes", "no"),
            ]
        ],
        f"calibration: {outcome['n']} held-out users, the reader {outcome.get('reader')}",
    )
    labels = list(outcome["pass_rate"])
    diffs = {k: v for k, v in outcome.items() if k.endswith(f"_minus_{labels[0]}")}
    models = _table(
        ["model", "next-session pass rate", f"minus {labels[0]} [95%]"],
        [
            [
                escape(label),
                _num(outcome["pass_rate"][label]),
                _num(diffs.get(f"{label}_minus_{labels[0]}"))
                + _ci(outcome.get("ci95", {}).get(f"{label}_minus_{labels[0]}")),
            ]
            for label in labels
        ],
        "ranking: " + (" > ".join(outcome["ranking"]) if outcome.get("ranking") else "none (the calibration fails)"),
    )
    return calibration + models


def _read_jsonl(path: Path) -> dict[str, dict[str, Any]]:
    if not path.is_file():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["key"]: r for r in rows}


def _heard(rate: float | None) -> str:
    if rate is None:
        return "next session: not played (the outcome plays each held-out user's first session)"
    return f"next session with these notes: pass rate {_num(rate)}"


def _sessions(eval_dir: Path, data_rows: Mapping[str, Mapping[str, Any]], labels: Sequence[str], count: int) -> str:
    scored = {label: _read_jsonl(eval_dir / label / "scores.jsonl") for label in labels}
    outcome = {label: _read_jsonl(eval_dir / label / "outcome_scores.jsonl") for label in labels}
    keys = [k for k in scored[labels[0]] if all(k in scored[label] for label in labels)]
    # Sessions where the models' scores differ first: what changed is what a reader wants to see.
    keys.sort(key=lambda k: -len({scored[label][k].get("score") for label in labels}))
    blocks = []
    for key in keys[:count]:
        row = data_rows.get(key, {})
        said = "<br>".join(escape(u) for u in row.get("enforcements", [])) or "-"
        expected = ", ".join(row.get("expected", [])) or "-"
        cells = []
        for label in labels:
            line = scored[label][key]
            notes = extract_notes(line["completion"])
            heard = outcome[label].get(key, {}).get("with_notes")
            drawn = len(line.get("draws", []))
            mean = (
                f"; the session's {drawn} draws score {_num(session_measure(line, 'score'), 2)} on average"
                if drawn > 1
                else ""
            )
            cells.append(
                f'<div class="notes">{escape(notes if notes is not None else "(no usable notes)")}</div>'
                f'<p class="small">judge {_num(line.get("judge_score"), 2)}/3: {escape(line.get("reasoning", ""))}</p>'
                f'<p class="small">format {_num(line.get("format"), 2)}: {escape(line.get("format_reason", ""))}'
                f"{mean}</p>"
                f'<p class="small">{_heard(heard)}</p>'
            )
        blocks.append(
            f'<h3>{escape(key)}</h3><p class="small">the user said: {said}<br>expected in the notes: '
            f"{escape(expected)}</p>" + _table(list(labels), [cells])
        )
    return "".join(blocks)


def write_html(
    run_dir: Path,
    report: Mapping[str, Any],
    eval_dir: Path,
    data_rows: Mapping[str, Mapping[str, Any]],
    *,
    title: str,
    sessions: int = 4,
) -> Path:
    """`<run>/report.html` from the report's sections, the chart file and the eval folder's per-row files."""
    results = report.get("held_out", {})
    parts = [f"<h1>{escape(title)}</h1>", _verdict(report)]
    chart = Path(report["reward_curve"]) if report.get("reward_curve") else None
    if chart is not None and chart.is_file():
        data = base64.b64encode(chart.read_bytes()).decode()
        parts += [
            "<h2>Reward curve and held-out scores</h2>",
            f'<img alt="GRPO reward per step and held-out scores" src="data:image/png;base64,{data}">',
        ]
    parts += ["<h2>Held-out reflections</h2>", _held_out(results, report.get("held_out_decoding"))]
    if (outcome := report.get("outcome")) is not None:
        parts += ["<h2>Next session with the notes</h2>", _outcome(outcome)]
    if results:
        parts += ["<h2>Held-out sessions side by side</h2>", _sessions(eval_dir, data_rows, list(results), sessions)]
    page = (
        f'<!doctype html><html><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f"<style>{_STYLE}</style></head><body>{''.join(parts)}</body></html>"
    )
    path = run_dir / HTML_FILE
    path.write_text(page, encoding="utf-8")
    return path
