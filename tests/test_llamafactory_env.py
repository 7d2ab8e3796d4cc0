"""LLaMA-Factory gets its own environment, created on request and called by path."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import MemrlCLI


def test_dry_run_lists_the_steps(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    out = memrl_cli("env", "llamafactory", "--path", tmp_path / "lf", "--dry-run", check=True).stdout
    assert f"venv {tmp_path / 'lf'}" in out
    assert "llamafactory==0.9.5" in out and "torch==" in out
    assert not (tmp_path / "lf").exists()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_environment_is_created_and_isolated(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    env_dir = tmp_path / "lf"
    result = memrl_cli("env", "llamafactory", "--path", env_dir, timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    cli = Path(result.stdout.strip().splitlines()[-1])
    assert cli == env_dir / "bin" / "llamafactory-cli"
    version = subprocess.run([str(cli), "version"], capture_output=True, text=True, check=True).stdout
    assert "0.9.5" in version
    # Its pins differ from ours: that is why it lives apart.
    trl = subprocess.run(
        [
            str(env_dir / "bin" / "python"),
            "-c",
            "import trl, transformers; print(trl.__version__, transformers.__version__)",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert trl[0].startswith("0.")
    import trl as our_trl

    assert our_trl.__version__.startswith("1.")
    # A second call finds it ready and changes nothing.
    again = memrl_cli("env", "llamafactory", "--path", env_dir, check=True, timeout=60)
    assert again.stdout.strip() == str(cli)
