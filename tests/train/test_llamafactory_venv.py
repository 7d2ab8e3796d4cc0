"""LLaMA-Factory gets its own environment, created on request and called by path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from support import MemrlCLI

from memrl.train.config import SFTStage
from memrl.train.llamafactory import backend as lf
from memrl.train.llamafactory import venv as lfe

ROOT = Path(__file__).resolve().parents[2]


def test_dry_run_lists_the_steps(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    out = memrl_cli("env", "llamafactory", "--path", tmp_path / "lf", "--dry-run", check=True).stdout
    assert f"venv --quiet --clear --seed --python {sys.executable} {tmp_path / 'lf'}" in out
    assert "llamafactory==0.9.5" in out and "torch==" in out
    assert not (tmp_path / "lf").exists()


@pytest.mark.parametrize("report_to", ["wandb", "none"])
def test_environment_has_what_the_yaml_reports_to(report_to: str) -> None:
    """A recipe logs to wandb by default: llamafactory-cli fails at start when its environment lacks the logger."""
    stage = SFTStage(kind="sft", trainer="llamafactory", model="m", data="d")
    args = lf.sft_yaml(stage, model_path="m", dataset_dir=Path("d"), out_dir=Path("o"), cpu=True, report_to=report_to)
    installed = {Requirement(r).name: Requirement(r) for r in lfe.requirements(cpu=True)}
    ours = {
        r.name: r
        for r in map(Requirement, tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    }
    for logger in {args["report_to"]} - {"none"}:
        assert logger in installed, f"the YAML reports to {logger}, which the environment does not install"
        assert installed[logger].specifier == ours[logger].specifier  # the same range as memrl's


def test_gpu_environment_has_deepspeed_for_the_zero2_config() -> None:
    stage = SFTStage(kind="sft", trainer="llamafactory", model="m", data="d", batch_size=16)
    args = lf.sft_yaml(stage, model_path="m", dataset_dir=Path("d"), out_dir=Path("o"), cpu=False)
    assert args["deepspeed"] == lf.DEEPSPEED_FILE  # 8 GPUs by default
    gpu = {Requirement(r).name for r in lfe.requirements(cpu=False)}
    assert "deepspeed" in gpu and "deepspeed" not in {Requirement(r).name for r in lfe.requirements(cpu=True)}


def test_environment_keeps_transformers_below_5_6() -> None:
    """LLaMA-Factory 0.9.5 admits transformers 5.6.0, which verl and later LLaMA-Factory releases exclude."""
    pins = [Requirement(line) for line in lfe.constraints("2.13.0").splitlines()]
    assert str(pins[0]) == "torch==2.13.0"
    (transformers,) = [p for p in pins if p.name == "transformers"]
    assert not transformers.specifier.contains("5.6.0") and transformers.specifier.contains("5.5.4")


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_environment_is_created_and_isolated(llamafactory_venv: Path, memrl_cli: MemrlCLI) -> None:
    # Built by the session fixture through `memrl env llamafactory` (CI has none), or one this machine has.
    env_dir = llamafactory_venv
    cli = env_dir / "bin" / "llamafactory-cli"
    assert (env_dir / ".memrl-ready").is_file() and cli.is_file()
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


TWO_RANKS = """
import time
import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
time.sleep(1.5)  # the stores are up: the test samples what listens
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("shimmed", [True, False], ids=["memrl-torchrun", "lf-own-torchrun"])
def test_llamafactorys_torchrun_on_one_node_listens_on_loopback_only(
    shimmed: bool, llamafactory_venv: Path, tmp_path: Path
) -> None:
    """LLaMA-Factory runs `torchrun` by name (its launcher, FORCE_TORCHRUN on several GPUs), from its own environment
    where memrl is not installed. Its own torchrun's store listens on every interface; the `torchrun` memrl puts first
    on PATH (loopback_torchrun) is memrl's loopback launcher run by LLaMA-Factory's python. Two gloo ranks on CPU,
    started the way LLaMA-Factory's launcher starts them, with the environment cli_env gives a single node."""
    import os

    from support import Listeners

    from memrl.train.distributed import ONE_NODE_ENV

    (tmp_path / "ranks.py").write_text(TWO_RANKS)
    bin_dir = llamafactory_venv / "bin"
    path = f"{bin_dir}:{os.environ['PATH']}"
    if shimmed:
        path = f"{lf.loopback_torchrun(tmp_path / '.bin', bin_dir / 'python')}:{path}"
    env = {**os.environ, **ONE_NODE_ENV, "PATH": path, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    from memrl.rollout.serve import free_port

    argv = ["torchrun", "--nnodes", "1", "--node_rank", "0", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
            "--master_port", str(free_port()), str(tmp_path / "ranks.py")]  # fmt: skip
    with Listeners(os.getpid(), every=0.1) as listeners:
        done = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    commands = " ".join(command for _, command, _ in listeners.found)
    assert listeners.found, "nothing listened: the sampling missed the run"
    if shimmed:
        assert "python -c import runpy" in commands, listeners.found  # the store is the shim's, memrl's launcher
        assert not listeners.exposed(), listeners.exposed()
    else:  # what the shim is for: LLaMA-Factory's own torchrun listens beyond this machine
        assert listeners.exposed(), listeners.found
