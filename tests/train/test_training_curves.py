"""Charts on CPU. verl's metrics are written by verl 0.9.1's own file logger (what a GPU run writes), HF
Trainer log histories as TRL and the judger keep them, the judger's ROC/PR, and Recall@k of the TOD metrics."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support import FIXTURES, MemrlCLI

from memrl.train.curves import Chart, loss_chart, recall_chart, roc_pr_chart, verl_chart
from memrl.train.verl import metrics as verl_metrics

PNG = b"\x89PNG\r\n\x1a\n"


def _png(chart: Chart | None, path: Path) -> Chart:
    assert chart is not None and chart.path == path
    assert path.read_bytes()[:8] == PNG and path.stat().st_size > 5000
    return chart


def _log_with_verl(stage: Path, rows: list[tuple[int, dict[str, float]]], monkeypatch: pytest.MonkeyPatch) -> None:
    """One verl attempt: verl's FileLogger at the path memrl hands it, as `Tracking(..., ["file"])` builds it."""
    tracking = pytest.importorskip("verl.utils.tracking")
    monkeypatch.setenv(verl_metrics.PATH_ENV, verl_metrics.tracking_env(stage, wandb=False)[verl_metrics.PATH_ENV])
    logger = tracking.Tracking(project_name="memrl", experiment_name="t", default_backend=["file"])
    for step, data in rows:
        logger.log(data=data, step=step)
    logger.finish()


def _grpo_step(step: int) -> dict[str, float]:
    return {
        "critic/score/mean": 0.1 * step,
        "actor/kl_loss": 0.001 * step,
        "actor/ppo_kl": 0.0001 * step,
        "response_length/mean": 300.0 - step,
        "actor/entropy": 1.0 / step,
        "timing_s/step": 12.0,
    }


def test_verl_grpo_metrics_draw_reward_parts_kl_length_and_entropy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stage = tmp_path / "grpo"
    stage.mkdir()
    val = {"val-core/collab/reward/mean@1": 0.5, "val-aux/collab/coverage/mean@1": 0.4,
           "val-aux/collab/format/mean@1": 0.9, "val-aux/collab/score/mean@1": 0.5}  # fmt: skip
    # Attempt 1 dies after step 3; the resumed attempt logs step 3 again, with validation, and step 4.
    _log_with_verl(stage, [(1, _grpo_step(1)), (2, _grpo_step(2)), (3, {"critic/score/mean": -9.0})], monkeypatch)
    assert verl_metrics.archive(stage) == stage / "verl_metrics-1.jsonl"
    _log_with_verl(stage, [(3, _grpo_step(3) | val), (4, _grpo_step(4) | {"critic/score/mean": float("nan")})],
                   monkeypatch)  # fmt: skip
    first = json.loads((stage / verl_metrics.METRICS_FILE).read_text().splitlines()[0])
    assert first["step"] == 3 and first["data"]["critic/score/mean"] == pytest.approx(0.3)  # verl's own line format

    chart = _png(verl_chart(verl_metrics.read(stage), stage / "curves.png"), stage / "curves.png")
    assert [p.title for p in chart.panels] == ["reward", "KL", "response length", "entropy"]
    reward = chart.panel("reward").series
    # The resumed step 3 replaced the dead attempt's; step 4's NaN reward (judge failed) is left out.
    assert reward["train reward"] == [(1, pytest.approx(0.1)), (2, pytest.approx(0.2)), (3, pytest.approx(0.3))]
    assert reward["eval reward"] == [(3.0, 0.5)]
    assert reward["eval coverage"] == [(3.0, 0.4)] and reward["eval format"] == [(3.0, 0.9)]
    assert "eval score" not in reward  # the same number as the reward
    assert set(chart.panel("KL").series) == {"KL loss (to the reference)", "PPO KL (to the rollout policy)"}
    assert [x for x, _ in chart.panel("response length").series["mean tokens"]] == [1, 2, 3, 4]
    assert chart.panel("entropy").series["policy entropy"][-1] == (4.0, 0.25)


def test_verl_sft_metrics_draw_loss_and_learning_rate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stage = tmp_path / "sft"
    stage.mkdir()
    rows = [(s, {"train/loss": 2.0 / s, "train/lr": 1e-6 * s, "train/grad_norm": 1.0}) for s in range(1, 5)]
    _log_with_verl(stage, [*rows, (4, {"val/loss": 0.7})], monkeypatch)  # verl logs validation separately
    chart = _png(verl_chart(verl_metrics.read(stage), stage / "curves.png"), stage / "curves.png")
    assert [p.title for p in chart.panels] == ["loss", "learning rate"]
    assert chart.panel("loss").series["eval loss"] == [(4.0, 0.7)]
    assert len(chart.panel("loss").series["train loss"]) == len(chart.panel("learning rate").series["lr"]) == 4


def test_no_metrics_draw_nothing(tmp_path: Path) -> None:
    (tmp_path / verl_metrics.METRICS_FILE).write_text('{"step": 1, "data": {"critic/sc')  # cut by a kill
    assert verl_chart(verl_metrics.read(tmp_path), tmp_path / "c.png") is None
    assert not (tmp_path / "c.png").exists()
    assert verl_metrics.archive(tmp_path / "missing") is None


def test_run_report_draws_the_reward_curve_of_a_verl_grpo_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report's reward curve read TRL's log_history.json only; verl stages left none."""
    from memrl.train.report import grpo_logs, write_report

    for name in ("grpo", "sft"):
        (tmp_path / name).mkdir()
    _log_with_verl(tmp_path / "grpo", [(s, _grpo_step(s)) for s in (1, 2, 3)], monkeypatch)
    _log_with_verl(tmp_path / "sft", [(1, {"train/loss": 1.0})], monkeypatch)  # no reward: not on the curve
    assert grpo_logs(tmp_path, {}) == {"grpo": tmp_path / "grpo" / verl_metrics.METRICS_FILE}
    report = json.loads(write_report(tmp_path, {"base": {"score": 0.1}}, None, {}).read_text())
    assert report["reward_curve"] == str(tmp_path / "reward_curve.png")
    assert (tmp_path / "reward_curve.png").read_bytes()[:8] == PNG


def test_hf_log_history_draws_train_and_eval_loss(tmp_path: Path) -> None:
    history = [
        {"loss": 2.0, "learning_rate": 1e-5, "epoch": 0.5, "step": 1},
        {"loss": 1.5, "learning_rate": 5e-6, "epoch": 1.0, "step": 2},
        {"eval_loss": 1.6, "epoch": 1.0, "step": 2},
        {"train_runtime": 3.0, "train_loss": 1.75, "epoch": 1.0, "step": 2},
    ]
    chart = _png(loss_chart(history, tmp_path / "loss.png"), tmp_path / "loss.png")
    assert chart.panel("loss").series == {"train loss": [(1.0, 2.0), (2.0, 1.5)], "eval loss": [(2.0, 1.6)]}
    assert chart.panel("learning rate").series["lr"] == [(1.0, 1e-5), (2.0, 5e-6)]


def test_roc_and_pr_curves_of_judger_scores(tmp_path: Path) -> None:
    from sklearn.metrics import roc_auc_score

    labels = [0, 0, 1, 1, 0, 1, 0, 0]
    scores = [0.1, 0.4, 0.35, 0.8, 0.2, 0.9, 0.05, 0.6]
    chart = _png(roc_pr_chart(labels, scores, tmp_path / "roc.png"), tmp_path / "roc.png")
    ((roc_label, roc),) = chart.panel("ROC").series.items()
    assert roc_label == f"judger (AUC {roc_auc_score(labels, scores):.3f})"
    assert roc[0] == (0.0, 0.0) and roc[-1] == (1.0, 1.0)
    assert "positive rate 0.38" in chart.panel("precision-recall").series
    assert roc_pr_chart([1, 1], [0.2, 0.3], tmp_path / "one-class.png") is None


def test_recall_at_k_chart_of_tod_metrics(tmp_path: Path) -> None:
    metrics = {f"{p}{m}@{k}": round(0.1 * k + (0.3 if p else 0), 2) for p in ("", "ceiling_")
               for m in ("recall", "pair_recall") for k in (1, 3, 5)} | {"jga": 0.5, "setup": {"top_k": 5}}  # fmt: skip
    chart = _png(recall_chart(metrics, tmp_path / "r.png"), tmp_path / "r.png")
    facts = chart.panel("Recall@k (gold facts)").series
    assert facts == {"pipeline": [(1.0, 0.1), (3.0, 0.3), (5.0, 0.5)], "ceiling": [(1.0, 0.4), (3.0, 0.6), (5.0, 0.8)]}
    assert set(chart.panel("Recall@k (gold pairs)").series) == {"pipeline", "ceiling"}


# ---- the wiring: trainers and evaluations write their charts ------------------------------------------------------


@pytest.mark.slow
def test_judger_training_and_evaluation_write_loss_roc_pr_and_recall_charts(tmp_path: Path, model_cache: Path) -> None:
    from memrl.data_gen.config import JudgerDataConfig
    from memrl.data_gen.judger import build_judger_dataset
    from memrl.train.config import JudgerStage
    from memrl.train.hf_trainer import TrainContext
    from memrl.train.judger.data import pairs_file
    from memrl.train.judger.evaluate import evaluate_judger
    from memrl.train.judger.trainer import train_judger

    data = tmp_path / "data"
    build_judger_dataset(JudgerDataConfig(tod_dir=FIXTURES / "mstod", eval_individuals=2), data)
    stage = JudgerStage(kind="judger", model="judger", max_steps=3, batch_size=8, micro_batch_size=8, max_length=96)
    final = train_judger(stage, "minilm", data, TrainContext(tmp_path / "judger", "judger", 0, "none", "t"))
    assert (tmp_path / "judger" / "loss_curve.png").read_bytes()[:8] == PNG
    out = tmp_path / "eval"
    evaluate_judger(str(final), pairs_file(data, "eval"), out, retriever="bm25", max_queries=8)
    assert (out / "roc_pr.png").read_bytes()[:8] == PNG and (out / "recall_at_k.png").read_bytes()[:8] == PNG


@pytest.mark.slow
def test_eval_tod_writes_the_recall_at_k_chart(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    data = FIXTURES / "mstod"
    out = tmp_path / "run"
    result = memrl_cli("eval", "tod", "--data", data, "--schema", data / "schema.json", "--reader", "template",
                       "--judger", "none", "--retriever", "bm25", "--individuals", "1", "--out", out,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "recall_at_k.png").read_bytes()[:8] == PNG
