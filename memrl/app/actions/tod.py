"""MS-TOD: `data tod` (SGD -> MS-TOD), `data judger` (MS-TOD -> judger pairs) and `eval tod`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console

from memrl.app.actions import Action
from memrl.core.errors import ConfigError
from memrl.core.files import describe_kind
from memrl.data_gen.config import JudgerDataConfig, TodDataConfig
from memrl.envs.tod.config import TodEvalConfig

# ---- data tod ----------------------------------------------------------------------------------------------------


def build_tod_data(cfg: TodDataConfig, out: Path, console: Console) -> dict[str, Any]:
    from memrl.data_gen.tod.dataset import build_tod_dataset, summary

    stats, gen = build_tod_dataset(cfg, out)
    return summary(stats, gen)


TOD_DATA = Action(
    "data tod",
    TodDataConfig,
    build_tod_data,
    "MS-TOD individuals from SGD goals, with memory banks; a rerun with the same settings resumes.",
    refs=("sgd_dir",),
)


# ---- data judger -------------------------------------------------------------------------------------------------


def build_judger_data(cfg: JudgerDataConfig, out: Path, console: Console) -> dict[str, Any]:
    from memrl.data_gen.judger import build_judger_dataset

    stats = build_judger_dataset(cfg, out)
    keys = ("rows", "queries", "individuals", "positives", "negatives", "positive_rate", "negatives_by_kind")
    splits = {split: {k: stats[split][k] for k in keys} for split in ("train", "eval")}
    return splits | {"memory": stats["memory"], "problems": stats["problems"]}


JUDGER_DATA = Action(
    "data judger",
    JudgerDataConfig,
    build_judger_data,
    "Judger (query, memory QA pair) rows labelled by relevance; prints both splits' sizes and class balance.",
    refs=("tod_dir",),
)


# ---- eval tod ----------------------------------------------------------------------------------------------------

# What may change between a run and its resumption besides how the work runs (runfolder.RUNTIME_KEYS): which sessions.
RESUMABLE_CHANGES = {"individuals", "sessions", "split_from", "strict"}


def _check_inputs(cfg: TodEvalConfig) -> None:
    """Paths the workers will read, checked before any model or Ray starts."""
    if not cfg.data.is_dir():
        raise ConfigError(f"--data {cfg.data}: not a folder ({describe_kind(cfg.data)})")
    schema = cfg.schema_path()
    if (kind := describe_kind(schema)) not in ("a file", "a folder"):  # a FIFO exists, yet reading it would hang
        raise ConfigError(f"{schema}: no schema ({kind}); pass --schema with an SGD schema.json or an SGD folder")
    if cfg.judger is not None and not cfg.judger.is_dir():
        raise ConfigError(
            f"--judger {cfg.judger}: not a folder ({describe_kind(cfg.judger)}); a trained judger, or `none`"
        )
    if cfg.reader == "template" and cfg.llm_roles() and cfg.llm is None:
        raise ConfigError(f"--reader template plays no model: name one with --llm for the llm {cfg.llm_roles()[0]}")
    if cfg.split_from is not None:
        from memrl.envs.tod.runner import eval_individual_ids

        eval_individual_ids(cfg.split_from)


def _setup(cfg: TodEvalConfig, alpha_source: str) -> dict[str, Any]:
    """What the numbers were measured with, so metrics files compare on their own."""
    reader = "template" if cfg.reader == "template" else cfg.reader_model.model
    return {
        "judger": None if cfg.judger is None else str(cfg.judger),
        "retriever": cfg.retriever,
        "alpha": cfg.alpha,
        "alpha_source": alpha_source,
        "fusion": cfg.fusion,
        "top_k": cfg.top_k,
        "top_units": cfg.top_units,
        "reader": reader,
        "intent": cfg.intent,
        "reasoner": cfg.reasoner,
        "user": cfg.user,
        "supervisor": cfg.supervisor,
        "max_turns": cfg.max_turns,
        "llm": cfg.llm_or_default().model if cfg.llm_roles() else None,
        "quality_judge": None if cfg.quality_judge is None else cfg.quality_judge.model,
    }


def _fusion_unsaved(out: Path, cfg: TodEvalConfig) -> set[str]:
    """{"fusion"} when `out` holds a run saved before `fusion` existed that this one may resume: one without a
    judger (nothing fused), or one fusing the way those runs did (`minmax`)."""
    from memrl.core.files import read_json
    from memrl.core.runfolder import CONFIG_FILE

    saved = out / CONFIG_FILE
    if not saved.is_file():
        return set()
    before = read_json(saved, ConfigError)
    if not isinstance(before, dict) or "fusion" in before:
        return set()
    if cfg.judger is not None and cfg.fusion != "minmax":
        raise ConfigError(
            f"{out} holds a run fused the earlier way (min-max retrieval + raw probability): resume it with "
            "--fusion minmax, or use another --out"
        )
    return {"fusion"}


def evaluate_tod(cfg: TodEvalConfig, out: Path, console: Console) -> dict[str, Any]:
    from memrl.core.runfolder import claim
    from memrl.envs.registry import evaluation
    from memrl.envs.tod.formats import LoadProblems
    from memrl.envs.tod.metrics import RECALL_KS, compute_metrics
    from memrl.envs.tod.ranking import side_by_side
    from memrl.envs.tod.retrieval import resolve_alpha
    from memrl.envs.tod.runner import SESSIONS_FILE, finished_sessions
    from memrl.train.curves import RECALL_AT_K, recall_chart
    from memrl.train.judger.evaluate import print_summary

    _check_inputs(cfg)
    alpha, alpha_source = resolve_alpha(cfg.alpha, cfg.judger)
    cfg = cfg.model_copy(update={"alpha": alpha})  # the run's config records the alpha it fused with
    claim(out, cfg, may_change=RESUMABLE_CHANGES | _fusion_unsaved(out, cfg))
    problems = LoadProblems()
    run = evaluation("tod")(cfg, out, console, problems)
    sessions = finished_sessions(run, out)
    metrics = compute_metrics(sessions) | {"setup": _setup(cfg, alpha_source), "problems": problems.summary()}
    metrics["side_by_side"] = side_by_side(metrics, RECALL_KS)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print_summary(metrics, RECALL_KS, console)
    if missing := metrics.get("sessions_without_rankings"):
        console.print(
            f"{missing} judger-fused session record(s) lack the retrieval-alone and judger-alone rankings (written "
            "before they were kept): those columns and the gain cover the other sessions",
            style="yellow",
            markup=False,
        )
    chart = recall_chart(metrics, out / RECALL_AT_K, title=f"eval tod ({cfg.retriever})")
    console.print(f"wrote {out / SESSIONS_FILE}, {out / 'metrics.json'}" + (f", {chart.path}" if chart else ""))
    run.check("eval tod")  # sessions failed and none finished: fail, now that the metrics say so
    return metrics


EVAL_TOD = Action(
    "eval tod",
    TodEvalConfig,
    evaluate_tod,
    "Multi-session TOD: recall slot values from earlier sessions, confirm them, fix the rest; writes metrics. A "
    "rerun into the same folder resumes: finished sessions are kept and skipped.",
    refs=("data", "judger", "split_from", "schema_file"),
)
