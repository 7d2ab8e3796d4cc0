"""The bundled TOD and PAHF flow recipes, run as users run them (`--smoke`, shipped fixtures, embedded models)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import FIXTURES

pytestmark = pytest.mark.slow


def test_tod_flow_sgd_to_judger_to_eval_and_a_rerun_redoes_nothing(memrl_cli, tmp_path: Path) -> None:
    args = ("run", "tod", "--smoke", f"stages.mstod.sgd_dir={FIXTURES / 'sgd'}", f"output_dir={tmp_path}")
    result = memrl_cli(*args, cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    stats = json.loads((tmp_path / "pairs" / "stats.json").read_text())
    assert stats["eval"]["individuals"] == 2 and stats["train"]["rows"] > 0
    assert (tmp_path / "judger" / "final" / "memrl_judger.json").is_file()
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["sessions"] == 2
    assert metrics["setup"]["judger"] == str(tmp_path / "judger")  # the stage name resolved to its folder
    eval_ids = set(json.loads((tmp_path / "pairs" / "stats.json").read_text())["individuals"]["eval"])
    records = (tmp_path / "eval" / "sessions.jsonl").read_text().splitlines()
    assert {json.loads(r)["persona_id"] for r in records} <= eval_ids  # split_from: held-out individuals only

    again = memrl_cli(*args, cwd=tmp_path, timeout=900)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "judger: already finished" in again.stdout + again.stderr
    assert (tmp_path / "eval" / "sessions.jsonl").read_text().splitlines() == records


def test_pahf_flow_protocol_then_writer_data(memrl_cli, tmp_path: Path) -> None:
    args = ("run", "pahf", "--smoke", f"stages.eval.data={FIXTURES / 'pahf'}", f"output_dir={tmp_path}")
    result = memrl_cli(*args, cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["tasks"] == {"planned": 8, "finished": 8, "failed": 0, "retried": 0}
    assert set(metrics["phases"]) == {"1", "2", "3", "4"}
    stats = json.loads((tmp_path / "writer" / "stats.json").read_text())
    assert stats["tasks"] == 8  # the writer data read the eval stage's run
    assert Path(stats["source"]) == tmp_path / "eval" / "tasks.jsonl"
