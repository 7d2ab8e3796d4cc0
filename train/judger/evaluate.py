"""Memory activation on held-out judger data: does the judger lift the gold QA pairs into the top k?

Per query (one confirming session): intent-aligned retrieval over its candidates gives s_pre, the judger gives
s, and the fused score alpha * s_pre + (1 - alpha) * s, both on one per-query scale (`retrieval.fuse`), ranks the
retrieved pairs; retrieval alone, the judger alone and fused are scored side by side, with the judger's AUC (all
pairs, and the retrieved ones it re-ranks), Brier score and ECE. `recall@k` counts the distinct gold
(slot, value) facts some top-k pair carries, `pair_recall@k` the gold pairs themselves (gold outside the kept units
counts as missed), and `ceiling_*` is the best any ranking of the query's pairs reaches (`envs.tod.ranking`).
Judger scores stream to `scores.jsonl`, so a killed run resumes where it stopped.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from memrl.core.errors import ConfigError
from memrl.core.files import ResumableJsonl
from memrl.core.progress import progress
from memrl.data_gen.judger_pairs import JudgerPair, read_pairs
from memrl.envs.tod.ranking import (
    GAIN_K,
    RankedQuery,
    auc,
    brier,
    ece,
    fact_of,
    gain_interval,
    judger_gain,
    mean_scores,
    recall_names,
    side_by_side,
    table_lines,
)
from memrl.envs.tod.retrieval import build_retriever, fuse, resolve_alpha, retrieve
from memrl.rollout.judger.scorer import JUDGER_FILE
from memrl.train.curves import RECALL_AT_K, ROC_PR, recall_chart, roc_pr_chart
from memrl.train.judger.config import JudgerEvalConfig
from memrl.train.judger.data import by_query, require_pairs

ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)
KS = (1, 3, 5)


def score_pairs(
    judger: str, rows: Sequence[JudgerPair], out: Path, batch_size: int, console: Console
) -> dict[str, float]:
    """Judger probability per pair key, reusing the scores a previous run wrote."""
    from memrl.rollout.judger.scorer import judger_folder, load_judger

    # Scores of another judger (or of this folder before it was retrained) must not be reused.
    folder = judger_folder(judger)
    info = folder / JUDGER_FILE
    identity = {"judger": str(folder.resolve()), "trained": info.stat().st_mtime_ns if info.is_file() else None}
    meta = out / "scores.meta.json"
    if not meta.is_file() or json.loads(meta.read_text()) != identity:
        (out / "scores.jsonl").unlink(missing_ok=True)
        meta.write_text(json.dumps(identity))
    scores = ResumableJsonl(out / "scores.jsonl")
    todo = [r for r in rows if r.key not in scores.done]
    if todo:
        with console.status(f"loading judger {judger}"):
            scorer = load_judger(judger)
        chunk = batch_size * 8  # a few batches between appends: resume granularity vs fsync cost
        with progress(console) as bar:
            task = bar.add_task("judger: scoring pairs", total=len(todo))
            for start in range(0, len(todo), chunk):
                part = todo[start : start + chunk]
                probs = scorer.score([r.judger_input() for r in part], batch_size=batch_size)
                for row, p in zip(part, probs, strict=True):
                    scores.append({"key": row.key, "query_id": row.query_id, "label": row.label, "score": p})
                bar.advance(task, len(part))
    return {str(r["key"]): float(r["score"]) for r in scores.records()}


def evaluate_judger(
    judger: str | None,
    pairs_path: Path,
    out: Path,
    *,
    retriever: str = "dense",
    alpha: float | None = None,
    fusion: str = "rank",
    top_units: int | None = 3,
    alphas: Sequence[float] = ALPHAS,
    ks: Sequence[int] = KS,
    batch_size: int = 32,
    max_queries: int | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """Write and return `out/metrics.json`. `judger=None`: retrieval alone (the judger keys are null). `alpha=None`:
    the judger's own (`retrieval.resolve_alpha`). `max_queries` keeps the first N queries of the file (smoke runs)."""
    console = console or Console(stderr=True)
    alpha, alpha_source = resolve_alpha(alpha, judger)
    rows = read_pairs(pairs_path)
    if max_queries is not None:
        first = set(list(dict.fromkeys(r.query_id for r in rows))[:max_queries])
        rows = [r for r in rows if r.query_id in first]
    keys = [r.key for r in rows]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise ConfigError(f"{pairs_path}: pair key {dup!r} appears twice")
    out.mkdir(parents=True, exist_ok=True)
    judged = score_pairs(judger, rows, out, batch_size, console) if judger is not None else None

    queries = by_query(rows)
    sweep: list[float] = sorted({*alphas, alpha})
    # Ranking name -> one RankedQuery per query: retrieval alone, the judger alone, fused at each alpha of the sweep.
    names: list[str | float] = ["retrieval", "judger", *sweep]
    rankings: dict[str | float, list[RankedQuery]] = {name: [] for name in names}
    retrieved: list[str] = []  # keys of the pairs the kept units hold: what the judger re-ranks
    ranker = build_retriever(retriever)
    with progress(console) as bar:
        task = bar.add_task(f"retrieval ({retriever})", total=len(queries))
        for query_rows in queries.values():
            gold = {r.key for r in query_rows if r.label == 1}
            facts = {r.key: fact_of(r.slot, r.answer) for r in query_rows}
            query = query_rows[0].intent_query
            kept = retrieve(query, [r.candidate() for r in query_rows], ranker, top_units)
            retrieved += [c.key for c, _ in kept]

            def ranked(order: Sequence[int]) -> RankedQuery:
                return RankedQuery([kept[i][0].key for i in order], gold, facts, list(facts))  # noqa: B023

            rankings["retrieval"].append(ranked(range(len(kept))))
            if judged is not None:
                s_pre = [s for _, s in kept]
                s_j = [judged[c.key] for c, _ in kept]
                rankings["judger"].append(ranked(sorted(range(len(kept)), key=lambda i: -s_j[i])))
                for a in sweep:
                    fused = fuse(s_pre, s_j, a, fusion)
                    rankings[a].append(ranked(sorted(range(len(kept)), key=lambda i: -fused[i])))
            bar.advance(task)

    def recalls(name: str | float) -> dict[str, float | None]:
        """`recall@k` (distinct gold facts) and `pair_recall@k` (gold pairs) of one ranking."""
        means = mean_scores((q.recalls(ks) for q in rankings[name]), recall_names(ks))
        return {key: _round(value) for key, value in means.items()}

    def per_query(name: str | float) -> list[float]:
        """Each query's `recall@GAIN_K` under one ranking (NaN without gold), for the gain's paired interval."""
        return [q.recalls([GAIN_K])[f"recall@{GAIN_K}"] for q in rankings[name]]

    # The ceilings do not depend on the ranking: the best any ordering of each query's pairs could do.
    ceilings = mean_scores((q.ceilings(ks) for q in rankings["retrieval"]), (f"ceiling_{n}" for n in recall_names(ks)))
    retrieval_only = recalls("retrieval")
    labels = [r.label for r in rows]
    probs = [judged[k] for k in keys] if judged is not None else []
    label_of = dict(zip(keys, labels, strict=True))
    metrics: dict[str, Any] = {
        **(recalls(alpha) if judged is not None else retrieval_only),
        **{f"retrieval_{k}": v for k, v in retrieval_only.items()},
        **{f"judger_{k}": (v if judged is not None else None) for k, v in recalls("judger").items()},
        **{name: _round(value) for name, value in ceilings.items()},
    }
    metrics |= {
        f"judger_gain@{GAIN_K}": judger_gain(metrics) if judged is not None else None,
        f"judger_gain@{GAIN_K}_interval": (
            gain_interval(per_query(alpha), per_query("retrieval")) if judged is not None else None
        ),
        "auc": _round(auc(labels, probs)) if judged is not None else None,
        # What the judger actually re-ranks: the pairs of the units retrieval kept.
        "auc_retrieved": (
            _round(auc([label_of[k] for k in retrieved], [judged[k] for k in retrieved]))
            if judged is not None
            else None
        ),
        "brier": _round(brier(labels, probs)) if judged is not None else None,
        "ece": _round(ece(labels, probs)) if judged is not None else None,
        "side_by_side": side_by_side(metrics, ks),
        "alpha_sweep": {str(a): recalls(a) for a in alphas} if judged is not None else None,
        # Each query's recall@5 per alpha (null without gold), in `query_ids` order: the sweep's noise.
        f"alpha_sweep_recall@{GAIN_K}_per_query": (
            {str(a): [None if math.isnan(v) else v for v in per_query(a)] for a in alphas}
            if judged is not None
            else None
        ),
        # The held-out effect per query (fused at `alpha`, retrieval alone, the judger alone), for pooling seeds.
        f"recall@{GAIN_K}_per_query": (
            {
                name: [None if math.isnan(v) else v for v in per_query(key)]
                for name, key in (("fused", alpha), ("retrieval", "retrieval"), ("judger", "judger"))
            }
            if judged is not None
            else None
        ),
        "query_ids": list(queries),
        "alpha": alpha,
        "alpha_source": alpha_source,
        "fusion": fusion,
        "retriever": retriever,
        "top_units": top_units,
        "judger": judger,
        "data": str(pairs_path),
        "queries": len(queries),
        "queries_with_gold": sum(1 for q in rankings["retrieval"] if q.gold),
        "pairs": len(rows),
        "retrieved_pairs": len(retrieved),
        "positives": sum(labels),
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    print_summary(metrics, ks, console)
    recall_chart(metrics, out / RECALL_AT_K, title=f"judger evaluation ({retriever}, alpha {alpha})")
    if judged is not None:
        roc_pr_chart(labels, probs, out / ROC_PR)
    return metrics


def evaluate_config(cfg: JudgerEvalConfig, out: Path, console: Console) -> dict[str, Any]:
    """`evaluate_judger` as `memrl eval judger` and the `eval_judger` stage call it."""
    if cfg.data is None:
        raise ConfigError("no judger data: pass --data (or, for a recipe, `data:` on the stage or data=DIR)")
    settings = cfg.model_dump(exclude={"judger", "data"})  # the rest are evaluate_judger's keywords, by name
    judger = None if cfg.judger is None else str(cfg.judger)
    return evaluate_judger(judger, require_pairs(cfg.data, "eval"), out, console=console, **settings)


def print_summary(metrics: dict[str, Any], ks: Sequence[int], console: Console) -> None:
    """The side-by-side table, the fusion used and the gain line (eval judger and eval tod alike)."""
    for line in table_lines(side_by_side(metrics, ks)):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    setup = metrics.get("setup", metrics)  # eval tod keeps how it ran under `setup`
    if setup.get("judger") is None:
        console.print("no judger: fused is retrieval alone", markup=False, highlight=False)
        return
    console.print(
        f"fused on the {setup['fusion']} scale, alpha {setup['alpha']} ({setup['alpha_source']})",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    gain = metrics.get(f"judger_gain@{GAIN_K}")
    shown = "-" if gain is None else f"{gain:+.4f}"
    interval = metrics.get(f"judger_gain@{GAIN_K}_interval") or {}
    if interval.get("ci95") is not None:
        low, high = interval["ci95"]
        shown += f", 95% CI [{low:+.4f}, {high:+.4f}] (paired bootstrap over {interval['queries']} queries)"
    console.print(
        f"judger_gain@{GAIN_K}: {shown} (fused minus retrieval alone)", markup=False, highlight=False, soft_wrap=True
    )


def _round(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 4)
