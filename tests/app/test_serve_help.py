"""`memrl serve` is for trying a model on this machine: its help sends GPU serving to `vllm serve` with tensor
parallelism, since it binds 127.0.0.1 only and runs one device."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from memrl.app.cli.main import app


def test_serve_help_sends_gpu_serving_to_vllm_serve() -> None:
    result = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200", "TERMINAL_WIDTH": "200"})
    assert result.exit_code == 0, result.output
    text = re.sub(r"\s+", " ", re.sub(r"[│╭╮╰╯─]", " ", result.output))
    assert "binds 127.0.0.1 only" in text and "on one device" in text
    assert "vllm serve MODEL --tensor-parallel-size" in text and "--gpu-memory-utilization" in text
