"""`tools/gpu_check.py --device cpu`: the GPU check's every phase on the tiny shapes, so the script cannot rot between
the days a GPU is lent. It runs as on the GPU machine, with memrl imported from the checkout, not the installed
package."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "gpu_check.py"
# The GPU machine has no memrl installed: drop this environment's editable install before the script runs.
UNINSTALLED = (
    "import runpy, sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f)]; "
    f"sys.argv = sys.argv[1:]; runpy.run_path({str(SCRIPT)!r}, run_name='__main__')"
)
PHASES = ("sft_lora", "grpo_lora", "full_step", "judger_bce", "export", "hf_generate")


@pytest.mark.slow
def test_every_phase_runs_on_the_cpu(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-c", UNINSTALLED, str(SCRIPT), "--device", "cpu", "--out", str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = (tmp_path / "gpu_check.txt").read_text().splitlines()
    rows = {line.split()[0]: line for line in table[1:-1]}
    assert list(rows) == list(PHASES)
    assert all("  ok" in line and "FAILED" not in line for line in rows.values()), "\n".join(table)
    moved = rows["full_step"].split("memrl: ")[1].split("%")[0]
    assert float(moved) > 50  # one step at lr 1e-6 from the bf16 weights moves them
    assert "memrl from /" in done.stdout and "memrl-layout-" in done.stdout  # the checkout, laid out as installed
    layout = Path(done.stdout.split("gpu_check: memrl from ", 1)[1].split()[0])
    assert not layout.parent.exists() and SCRIPT.is_file()  # the layout is removed at exit, the checkout is not


def test_a_cuda_run_without_a_gpu_fails_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode == 0:
        pytest.skip("this machine has a CUDA GPU")
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "gpu_check: --device cuda, but torch sees no CUDA device (use --device cpu)"
    ]
