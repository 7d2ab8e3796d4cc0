"""`memrl eval judger` and `memrl eval tod` side by side: retrieval alone, the judger alone and fused, the gain line,
the judger's calibration, and the fusion weight the judger chose on its training split."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
from support import FIXTURES, MemrlCLI

from memrl.envs.tod.ranking import brier, ece, side_by_side, table_lines

DATA = FIXTURES / "mstod"


def test_brier_and_ece() -> None:
    assert brier([1, 0], [1.0, 0.0]) == 0.0 and brier([1, 0], [0.0, 1.0]) == 1.0
    assert math.isnan(brier([], [])) and math.isnan(ece([], []))
    # Bin [0.0, 0.1): two pairs at 0.05, one positive (rate 0.5, mean 0.05); bin [0.9, 1.0]: one at 1.0, positive.
    assert ece([1, 0, 1], [0.05, 0.05, 1.0]) == pytest.approx((2 * 0.45 + 0) / 3)
    assert ece([0] * 4, [0.0944] * 4) == pytest.approx(0.0944)  # narrow and overconfident: miscalibrated


def test_side_by_side_table() -> None:
    metrics = {"recall@5": 0.6, "retrieval_recall@5": 0.5, "judger_recall@5": None, "ceiling_recall@5": 0.9}
    table = side_by_side(metrics, [5])
    assert list(table) == ["retrieval", "judger", "fused", "ceiling"]
    assert table["fused"] == {"recall@5": 0.6, "pair_recall@5": None} and table["judger"]["recall@5"] is None
    lines = table_lines(table)
    assert lines[1].split() == ["retrieval", "0.500", "-"] and len(lines) == 5


@pytest.fixture(scope="module")
def judger_data(mstod_judger_data: Path) -> Path:
    return mstod_judger_data


@pytest.fixture(scope="module")
def judger(mstod_judger: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's 2-step MiniLM judger, copied, with the fusion alpha 0.7 as if chosen on its training split."""
    final = tmp_path_factory.mktemp("judger-alpha") / "final"
    shutil.copytree(mstod_judger, final)
    info = json.loads((final / "memrl_judger.json").read_text())
    (final / "memrl_judger.json").write_text(json.dumps(info | {"alpha": 0.7}))
    return final


@pytest.mark.slow  # trains a judger and scores the eval split with it: about 90 s on 2 cores
def test_eval_judger_sets_the_rankings_side_by_side(judger: Path, judger_data: Path, tmp_path: Path) -> None:
    from memrl.envs.tod.retrieval import resolve_alpha
    from memrl.rollout.judger.scorer import JudgerInfo
    from memrl.train.judger.evaluate import evaluate_judger

    assert JudgerInfo.read(judger).alpha == 0.7  # the default: the alpha chosen on the training split
    pairs = judger_data / "eval" / "pairs.jsonl"
    m = evaluate_judger(str(judger), pairs, tmp_path / "e", retriever="bm25", alphas=[0.0, 0.1, 0.2, 1.0])
    assert m["alpha"] == 0.7 == resolve_alpha(None, judger)[0] and "training split" in m["alpha_source"]
    assert m["fusion"] == "rank" and set(m["alpha_sweep"]) == {"0.0", "0.1", "0.2", "1.0"}
    assert m["alpha_sweep"]["1.0"]["recall@5"] == m["retrieval_recall@5"]  # alpha 1: retrieval's order
    assert m["alpha_sweep"]["0.0"]["recall@5"] == m["judger_recall@5"]  # alpha 0: the judger's
    assert m["judger_gain@5"] == pytest.approx(m["recall@5"] - m["retrieval_recall@5"], abs=1e-4)
    interval = m["judger_gain@5_interval"]
    assert interval["queries"] == m["queries_with_gold"]
    assert interval["ci95"][0] <= m["judger_gain@5"] + 1e-4 and m["judger_gain@5"] - 1e-4 <= interval["ci95"][1]
    assert m["side_by_side"]["fused"]["recall@5"] == m["recall@5"]
    assert m["side_by_side"]["judger"]["pair_recall@1"] == m["judger_pair_recall@1"]
    assert 0.0 <= m["brier"] <= 1.0 and 0.0 <= m["ece"] <= 1.0
    assert 0.0 <= m["auc_retrieved"] <= 1.0 and m["retrieved_pairs"] <= m["pairs"]
    given = evaluate_judger(str(judger), pairs, tmp_path / "e", retriever="bm25", alpha=0.2, fusion="minmax")
    assert (given["alpha"], given["alpha_source"], given["fusion"]) == (0.2, "given", "minmax")
    plain = evaluate_judger(None, pairs, tmp_path / "r", retriever="bm25")
    assert plain["judger_gain@5"] is None and plain["side_by_side"]["judger"]["recall@5"] is None


@pytest.mark.slow  # Ray and the CLI: about 30 s
def test_eval_tod_prints_the_table_and_the_gain_line(judger: Path, tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    out = tmp_path / "tod"
    # The release's shape (bare service names, a foreign slot, no turn annotations), scored by the fixture's judger.
    release = DATA.parent / "mstod_release"
    base = ["eval", "tod", "--data", str(release), "--schema", str(DATA.parent / "sgd"),
            "--reader", "template", "--retriever", "bm25",
            "--individuals", "1", "--sessions", "2", "--max-turns", "1", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    result = memrl_cli(*base, "--judger", str(judger), env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    lines = result.stderr.splitlines()
    assert any(line.split()[:1] == ["retrieval"] for line in lines) and any(line.startswith("fused ") for line in lines)
    assert any(line.startswith("judger_gain@5: ") for line in lines)
    assert metrics["judger_gain@5_interval"]["queries"] == metrics["sessions_with_gold"]
    assert "fused on the rank scale, alpha 0.7 (chosen on the judger's training split" in result.stderr
    assert metrics["setup"]["alpha"] == 0.7 and metrics["setup"]["fusion"] == "rank"
    assert metrics["side_by_side"]["fused"]["recall@5"] == metrics["recall@5"]
    assert metrics["sessions_without_rankings"] == 0 and metrics["judger_gain@5"] is not None

    # A folder written before `fusion` existed fused the earlier way: resuming it asks for that fusion, and gets it.
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "fusion"}))
    refused = memrl_cli(*base, "--judger", str(judger), env=env, timeout=300)
    assert refused.returncode == 2 and "resume it with --fusion minmax" in refused.stderr.strip().splitlines()[-1]
    resumed = memrl_cli(*base, "--judger", str(judger), "--fusion", "minmax", env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((out / "config.json").read_text())["fusion"] == "minmax"
