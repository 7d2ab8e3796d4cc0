"""What collab GRPO did, measured on users and problems it never trained on (the `collab_heldout` stage's work).

The base policy and the trained one each play the same held-out sessions greedily (the eval side of the training
stage's own user and problem split, same seed, same task, user, agent kind and reply budget) through the one collab
runner; per session, the checker pass rate, task success, user effort and length are paired by (user, session,
problem), and the trained-minus-base difference of each gets a paired bootstrap interval. Written into the run's
`report.json` under `heldout`, with a bar chart beside it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import fmean
from typing import Any

from rich.console import Console

from memrl.core.errors import ConfigError
from memrl.core.stats import paired_difference
from memrl.envs.collab.agents import AgentKind
from memrl.envs.collab.config import CollabEvalConfig, CollabSampling
from memrl.envs.collab.records import SessionRecord
from memrl.envs.collab.rows import CollabRLConfig
from memrl.rewards.collab_episode import preference_share
from memrl.rollout.config import ModelConfig, SamplingConfig
from memrl.train.online.config import OnlineGRPOStage

METRICS = ("preference", "task_success", "user_effort", "length")
PLOT_FILE = "heldout.png"
REPORT_KEY = "heldout"
MODEL_STAMP = "model.json"

# ---- the sessions played ---------------------------------------------------------------------------------------------


def heldout_config(training: OnlineGRPOStage, *, users: int, sessions: int, workers: int | None) -> CollabEvalConfig:
    """The eval side of the `collab_grpo` stage's split (same task, problems, seed), played as it trained: same agent
    kind, user and turns, replies greedy within the same token budget. The model is set per policy."""
    env = training.env
    if not isinstance(env, CollabRLConfig):
        raise ConfigError(f"held-out collab users need a collab_grpo stage, not {training.kind}")
    sampling = CollabSampling(
        agent=SamplingConfig(temperature=0.0, max_tokens=training.max_turn_tokens, seed=env.seed),
        user=env.user_sampling,
    )
    return env.eval_config().model_copy(
        update={
            "split": "eval",
            "users": users,
            "sessions": sessions,
            "max_turns": env.max_turns,
            "agent": AgentKind(env.agent),
            "simulator": env.simulator,
            "user_model": env.user_model,
            "sampling": sampling,
            "workers": workers,
            "ray_address": env.ray_address,
        }
    )


def check_held_out(cfg: CollabEvalConfig) -> None:
    """The held-out users and problems share none with the whole train side the training stage draws from."""
    from memrl.envs.collab.problems import check_disjoint
    from memrl.envs.collab.runner import select_problems, select_profiles

    train = cfg.model_copy(update={"split": "train"})
    shared = {u.id for u in select_profiles(cfg)} & {u.id for u in select_profiles(train)}
    if shared:
        raise ConfigError(f"held-out users are also train users: {sorted(shared)[:3]}")
    check_disjoint(select_problems(train), select_problems(cfg))


def play(
    cfg: CollabEvalConfig, models: Mapping[str, str], policy: ModelConfig | None, out: Path, console: Console, name: str
) -> dict[str, list[SessionRecord]]:
    """Each policy (label -> model reference) plays the held-out sessions into `out/label`, served as the trained
    policy was (`policy`, its recipe model) when that was a local HF model; a rerun resumes."""
    from memrl.core.runfolder import claim
    from memrl.envs.collab.config import RESUMABLE_CHANGES
    from memrl.envs.collab.runner import run_collab
    from memrl.rollout.config import HFModelConfig
    from memrl.train.evaluate import servable_model

    records = {}
    for label, ref in models.items():
        model = servable_model(ref)  # an adapter checkpoint is merged once; a model folder is used as it is
        config = (
            policy.model_copy(update={"model": model})
            if isinstance(policy, HFModelConfig)
            else HFModelConfig(backend="hf", model=model)
        )
        console.print(f"{name}: {cfg.users} held-out users x {cfg.sessions} sessions with the {label} policy")
        played = cfg.model_copy(update={"model": config})
        forget_if_retrained(out / label, model, console, name)
        claim(out / label, played, may_change=RESUMABLE_CHANGES)  # a rerun resumes; another setup is refused
        records[label] = run_collab(played, out / label, console)
    return records


def _stamp(model: str) -> dict[str, Any]:
    """Which weights a policy had: its folder and when its weights were last written (a retrain into the same
    export folder keeps the path and changes the time)."""
    folder = Path(model)
    weights = [*folder.glob("*.safetensors"), *folder.glob("*.bin")] if folder.is_dir() else []
    return {
        "model": str(folder.resolve()) if folder.exists() else model,
        "written": max((f.stat().st_mtime_ns for f in weights), default=None),
    }


def forget_if_retrained(out: Path, model: str, console: Console, name: str) -> None:
    """Sessions played by other weights than `model` has now are not this policy's: they are played again."""
    import shutil

    saved, now = out / MODEL_STAMP, _stamp(model)
    if saved.is_file() and json.loads(saved.read_text()) != now:
        console.print(f"{name}: {out.name} policy changed since its held-out sessions were played: playing again")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(now))


# ---- the report, from per-session records ---------------------------------------------------------------------------


def session_metrics(record: SessionRecord) -> dict[str, float | None]:
    """One session's metrics; `preference` is None when the user reacted to no reply (nothing was checked)."""
    return {
        "preference": preference_share(record.to_dict()),  # the reward's own reading of the record's JSON
        "task_success": float(record.task_success),
        "user_effort": float(record.user_effort),
        "length": float(record.length),
    }


def pair_key(record: SessionRecord) -> tuple[str, int, str]:
    return record.user_id, record.session, record.problem_id


def heldout_report(
    base: Sequence[SessionRecord], trained: Sequence[SessionRecord], *, seed: int, resamples: int = 2000
) -> dict[str, Any]:
    """`n` paired sessions (`unpaired`: those finished on one side only, left out); per metric the base and trained
    means, `delta` (trained - base) and its paired bootstrap `ci95`, all over the pairs where both sides have it."""
    by_key = [{pair_key(r): session_metrics(r) for r in side} for side in (base, trained)]
    keys = sorted(by_key[0].keys() & by_key[1].keys())
    report: dict[str, Any] = {
        "n": len(keys),
        "unpaired": len(by_key[0].keys() ^ by_key[1].keys()),
        "base": {},
        "trained": {},
        "delta": {},
        "ci95": {},
    }
    for metric in METRICS:
        pairs = [(by_key[0][k][metric], by_key[1][k][metric]) for k in keys]
        kept = [(b, t) for b, t in pairs if b is not None and t is not None]
        b_scores, t_scores = [b for b, _ in kept], [t for _, t in kept]
        report["base"][metric] = _round(fmean(b_scores)) if kept else None
        report["trained"][metric] = _round(fmean(t_scores)) if kept else None
        found = paired_difference(t_scores, b_scores, resamples=resamples, seed=seed) if kept else None
        if found is None:  # fewer than two pairs: a difference, but no interval
            report["delta"][metric] = _round(t_scores[0] - b_scores[0]) if kept else None
            report["ci95"][metric] = None
        else:
            report["delta"][metric] = _round(found[0])
            report["ci95"][metric] = [_round(found[1][0]), _round(found[1][1])]
    return report


def _round(x: float) -> float:
    return round(x, 4) if math.isfinite(x) else x


def heldout_chart(report: Mapping[str, Any], out: Path, title: str | None = None) -> Path | None:
    """One panel per metric (their scales differ): base and trained bars, the trained bar's whisker the 95% interval
    of the difference placed on the base mean. None (no file) when no metric has a value."""
    shown = [m for m in METRICS if report["base"].get(m) is not None]
    if not shown:
        return None
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on clusters or CI
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(shown), figsize=(3.2 * len(shown), 3.4), squeeze=False)
    for ax, metric in zip(axes[0], shown, strict=True):
        base, trained, ci = report["base"][metric], report["trained"][metric], report["ci95"][metric]
        ax.bar([0, 1], [base, trained], color=["tab:grey", "tab:blue"], tick_label=["base", "trained"])
        if ci is not None:  # where the trained mean could lie, given the base, at 95%
            centre = base + report["delta"][metric]
            ax.errorbar([1], [centre], yerr=[[centre - (base + ci[0])], [(base + ci[1]) - centre]], color="black")
        interval = f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci is not None else ""
        ax.set_title(f"{metric}\ndelta {report['delta'][metric]:+.2f}{interval}", fontsize=9)
    fig.suptitle(title or f"held-out sessions: base vs trained (n={report['n']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def write_heldout(
    records: Mapping[str, Sequence[SessionRecord]],
    models: Mapping[str, str],
    run_dir: Path,
    *,
    run: str,
    seed: int,
    resamples: int,
) -> tuple[dict[str, Any], Path, Path | None]:
    """The report of the `base` and `trained` records, merged into `run_dir`'s `report.json` under `heldout` with
    the models compared, and its chart; returns (report, report.json, chart or None)."""
    from memrl.train.report import merge_report

    report = heldout_report(records["base"], records["trained"], seed=seed, resamples=resamples)
    plot = heldout_chart(report, run_dir / PLOT_FILE, f"{run}: held-out (n={report['n']})")
    report |= {"models": dict(models), "plot": str(plot) if plot else None}
    return report, merge_report(run_dir, {REPORT_KEY: report}), plot
