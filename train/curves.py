"""Charts as PNG files: verl training curves (from its file logger), HF Trainer loss curves, the judger's ROC and
precision-recall curves, and Recall@k. Each returns the `Chart` it drew (its series, as plotted), or None when there
was nothing to draw."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memrl.rewards.registry import REWARDS

Points = list[tuple[float, float]]
Steps = Mapping[int, Mapping[str, float]]  # step -> metric -> value (verl's file logger: memrl.train.verl.metrics)
# File names, in the folder of the stage or evaluation that drew them.
LOSS_CURVE = "loss_curve.png"
ROC_PR = "roc_pr.png"
RECALL_AT_K = "recall_at_k.png"


@dataclass(frozen=True)
class Panel:
    title: str
    series: dict[str, Points] = field(default_factory=dict)
    xlabel: str = "step"
    ylabel: str = ""
    diagonal: bool = False  # a dashed y = x (chance on a ROC curve)


@dataclass(frozen=True)
class Chart:
    path: Path
    panels: list[Panel]

    def panel(self, title: str) -> Panel:
        return next(p for p in self.panels if p.title == title)


def draw(panels: Sequence[Panel], out: Path, *, title: str | None = None) -> Chart | None:
    """One subplot per panel that has points; None (and no file) when none has."""
    kept = [p for p in (_nonempty(p) for p in panels) if p.series]
    if not kept:
        return None
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on clusters or CI
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(kept), figsize=(4.5 * len(kept), 3.5), squeeze=False)
    for ax, panel in zip(axes[0], kept, strict=True):
        for label, points in panel.series.items():
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker="o" if len(points) <= 30 else None, markersize=3, label=label)
        if panel.diagonal:
            ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=0.8)
        ax.set_title(panel.title)
        ax.set_xlabel(panel.xlabel)
        ax.set_ylabel(panel.ylabel)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return Chart(out, kept)


def _nonempty(panel: Panel) -> Panel:
    series = {label: points for label, points in panel.series.items() if points}
    return Panel(panel.title, series, panel.xlabel, panel.ylabel, panel.diagonal)


def _series(rows: Mapping[int, Mapping[str, float]], key: str) -> Points:
    return [(float(step), float(row[key])) for step, row in rows.items() if key in row]


# ---- verl: its metric names (verl 0.9.1: ray_trainer / metric_utils for GRPO, sft_trainer for SFT) ---------------

TRAIN_REWARD = "critic/score/mean"  # the mean reward of the step's rollouts
VERL_PANELS: dict[str, dict[str, str]] = {
    "reward": {"train reward": TRAIN_REWARD},
    "KL": {"KL loss (to the reference)": "actor/kl_loss", "PPO KL (to the rollout policy)": "actor/ppo_kl"},
    "response length": {"mean tokens": "response_length/mean"},
    "entropy": {"policy entropy": "actor/entropy"},
    "loss": {"train loss": "train/loss", "eval loss": "val/loss"},
    "learning rate": {"lr": "train/lr"},
}


def reward_parts() -> tuple[str, ...]:
    """The reward and the reflection reward's parts registered when the chart is drawn (importing
    memrl.train.rewards here would tie every importer of the charts to the collab world), on the validation set: verl
    logs the reward function's extra keys only for validation, as `val-core|val-aux/<data source>/<name>/mean@<n>`."""
    return ("reward", *(part for entry in REWARDS.values() if entry.build is not None for part in entry.parts))


_VAL = re.compile(r"^val-(?:core|aux)/(?P<source>[^/]+)/(?P<name>[^/]+)/mean@(?P<n>\d+)$")


def verl_chart(steps: Steps, out: Path, title: str | None = None) -> Chart | None:
    """GRPO: reward (train, and eval with its parts), KL, response length, entropy; SFT: loss and learning rate."""
    panels = [
        Panel(name, {label: _series(steps, key) for label, key in keys.items()}) for name, keys in VERL_PANELS.items()
    ]
    panels[0].series.update(eval_reward(steps))
    return draw(panels, out, title=title)


def eval_reward(steps: Steps) -> dict[str, Points]:
    """`eval <part>` per validation step, at the largest n verl averaged over (one source: no source in the label)."""
    parts = reward_parts()
    found: dict[tuple[str, str], tuple[int, str]] = {}
    for row in steps.values():
        for key in row:
            m = _VAL.match(key)
            if m and m["name"] in parts:
                best = found.get((m["source"], m["name"]))
                if best is None or int(m["n"]) > best[0]:
                    found[(m["source"], m["name"])] = (int(m["n"]), key)
    sources = {source for source, _ in found}
    out: dict[str, Points] = {}
    for (source, name), (_, key) in sorted(found.items(), key=lambda item: parts.index(item[0][1])):
        out[f"eval {name}" + (f" [{source}]" if len(sources) > 1 else "")] = _series(steps, key)
    return out


# ---- HF Trainer log history (TRL SFT, the judger) -----------------------------------------------------------------


def loss_chart(log_history: Sequence[Mapping[str, Any]], out: Path, title: str | None = None) -> Chart | None:
    """Train and eval loss, and the learning rate, per optimizer step of an HF Trainer's `state.log_history`."""
    rows: dict[int, dict[str, float]] = {}
    for entry in log_history:
        if "step" in entry:
            numbers = {k: float(v) for k, v in entry.items() if isinstance(v, int | float) and not isinstance(v, bool)}
            rows.setdefault(int(entry["step"]), {}).update(numbers)
    panels = [
        Panel("loss", {"train loss": _series(rows, "loss"), "eval loss": _series(rows, "eval_loss")}),
        Panel("learning rate", {"lr": _series(rows, "learning_rate")}),
    ]
    return draw(panels, out, title=title)


# ---- the judger's ranking quality ---------------------------------------------------------------------------------


def roc_pr_chart(labels: Sequence[int], scores: Sequence[float], out: Path, name: str = "judger") -> Chart | None:
    """ROC (with AUC) and precision-recall (with average precision) of scores against 0/1 labels; None with one
    class only (both curves are undefined then)."""
    if len(set(labels)) < 2:
        return None
    from sklearn.metrics import auc, average_precision_score, precision_recall_curve, roc_curve

    fpr, tpr, _ = roc_curve(labels, scores)
    precision, recall, _ = precision_recall_curve(labels, scores)
    rate = sum(labels) / len(labels)
    roc = Panel(
        "ROC",
        {f"{name} (AUC {auc(fpr, tpr):.3f})": _pairs(fpr, tpr)},
        "false positive rate",
        "true positive rate",
        diagonal=True,
    )
    ap = average_precision_score(labels, scores)
    pr = Panel(
        "precision-recall",
        {f"{name} (AP {ap:.3f})": _pairs(recall, precision), f"positive rate {rate:.2f}": [(0.0, rate), (1.0, rate)]},
        "recall",
        "precision",
    )
    return draw([roc, pr], out)


def _pairs(xs: Any, ys: Any) -> Points:
    return [(float(x), float(y)) for x, y in zip(xs, ys, strict=True)]


# ---- Recall@k (TOD evaluation, judger evaluation) -----------------------------------------------------------------

_RECALL = re.compile(r"^(?P<name>[a-z_]*recall)@(?P<k>\d+)$")


def recall_chart(metrics: Mapping[str, Any], out: Path, title: str | None = None) -> Chart | None:
    """Every `<prefix>recall@k` and `<prefix>pair_recall@k` of a metrics dict over k: distinct gold facts on the
    left, gold pairs on the right (`ceiling_`: the best any ranking could do)."""
    facts: dict[str, Points] = {}
    pairs: dict[str, Points] = {}
    for key, value in metrics.items():
        m = _RECALL.match(key)
        if m is None or not isinstance(value, int | float):
            continue
        name = m["name"]
        target, label = (
            (pairs, name.removesuffix("pair_recall"))
            if name.endswith("pair_recall")
            else (facts, name.removesuffix("recall"))
        )
        target.setdefault(label.rstrip("_") or "pipeline", []).append((float(m["k"]), float(value)))
    panels = [
        Panel("Recall@k (gold facts)", {k: sorted(v) for k, v in facts.items()}, "k", "recall"),
        Panel("Recall@k (gold pairs)", {k: sorted(v) for k, v in pairs.items()}, "k", "recall"),
    ]
    return draw(panels, out, title=title)


# ---- the reflector's GRPO reward and its held-out scores (report.json's reward_curve.png) --------------------------


@dataclass(frozen=True)
class RewardStep:
    """One GRPO step: the mean reward of its rollouts, the spread around it (TRL: mean +- std; verl: min..max) and
    the mean of each reward part."""

    step: float
    mean: float
    low: float | None = None
    high: float | None = None
    parts: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class HeldOutPoint:
    label: str
    mean: float
    low: float
    high: float


def _slope_line(
    ax: Any, center: tuple[float, float], ends: tuple[float, float], fit: Mapping[str, Any], style: str, what: str
) -> None:
    """A fitted slope drawn through the curve's center across its steps, its interval in the legend."""
    x0, y0 = center
    ax.plot(
        ends,
        [y0 + fit["slope"] * (x - x0) for x in ends],
        color="black",
        linestyle=style,
        linewidth=1.2,
        label=f"{what} {fit['slope']:+.4f}/step [{fit['ci95'][0]:+.4f}, {fit['ci95'][1]:+.4f}]",
    )


def reflector_chart(
    curves: Mapping[str, Sequence[RewardStep]],
    fits: Mapping[str, Mapping[str, Any]],
    held_out: Sequence[HeldOutPoint],
    out: Path,
    decoding: str | None = None,
) -> Chart | None:
    """Left: per GRPO stage the per-step mean reward with its spread as a band, its parts as thin lines, and the
    least-squares line with its slope interval in the legend (the within-prompt slope's dotted, where known). Right:
    each model's held-out score with its 95% interval, its axis naming how the notes were decoded where `decoding`
    says. None (and no file) when there is nothing to draw."""
    curves = {name: steps for name, steps in curves.items() if steps}
    if not curves and not held_out:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: list[Panel] = []
    fig, axes = plt.subplots(1, int(bool(curves)) + int(bool(held_out)), figsize=(11, 4), squeeze=False)
    axs = list(axes[0])
    if curves:
        ax = axs.pop(0)
        series: dict[str, Points] = {}
        for name, steps in curves.items():
            xs = [s.step for s in steps]
            ys = [s.mean for s in steps]
            (line,) = ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.6, label=f"{name} reward (mean)")
            series[f"{name} reward"] = list(zip(xs, ys, strict=True))
            if all(s.low is not None and s.high is not None for s in steps):
                ax.fill_between(
                    xs,
                    [s.low for s in steps],
                    [s.high for s in steps],
                    color=line.get_color(),
                    alpha=0.15,
                    label=f"{name} spread of the rollouts",
                )
            for part in sorted({p for s in steps for p in s.parts}):
                pts = [(s.step, s.parts[part]) for s in steps if part in s.parts]
                ax.plot(*zip(*pts, strict=True), linewidth=0.8, linestyle=":", label=f"{name} {part}")
                series[f"{name} {part}"] = pts
            if (fit := fits.get(name)) is not None:
                center = (sum(xs) / len(xs), sum(ys) / len(ys))
                ends = (min(xs), max(xs))
                _slope_line(ax, center, ends, fit, "--", "slope")
                if (within := fit.get("within_prompt")) is not None:
                    _slope_line(ax, center, ends, within, ":", f"within-prompt slope ({within['prompts']} prompts)")
        ax.set_title("GRPO reward per step")
        ax.set_xlabel("GRPO step")
        ax.set_ylabel("reward")
        ax.legend(fontsize=7)
        panels.append(Panel("GRPO reward per step", series, "GRPO step", "reward"))
    if held_out:
        ax = axs.pop(0)
        xs = list(range(len(held_out)))
        ys = [p.mean for p in held_out]
        errors = [[p.mean - p.low for p in held_out], [p.high - p.mean for p in held_out]]
        ax.errorbar(xs, ys, yerr=errors, fmt="o", capsize=5, markersize=6)
        for x, p in zip(xs, held_out, strict=True):
            ax.annotate(f"{p.mean:.3f}", (x, p.mean), textcoords="offset points", xytext=(8, 0), fontsize=8)
        ax.set_xticks(xs, [p.label for p in held_out])
        ax.set_xlim(-0.5, len(held_out) - 0.5)
        ax.set_title("held-out reward of each model (95% interval)")
        ylabel = "coverage + format" + (f", {decoding}" if decoding else "")
        ax.set_ylabel(ylabel.replace(", ", "\n", 1))  # the decoding on a line of its own: it can be long
        held = {"held-out": [(float(x), y) for x, y in zip(xs, ys, strict=True)]}
        panels.append(Panel("held-out score", held, "model", ylabel))
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return Chart(out, panels)
