"""LLaMA-Factory in its own virtual environment, called by path.

LLaMA-Factory 0.9.5 pins transformers<=5.6.0, trl<=0.24, peft<=0.18.1, datasets<=4.0 and accelerate<=1.11, while
memrl needs trl 1.x and the transformers range verl accepts: the two cannot share one environment. memrl builds
a separate venv with the same torch as the running one and runs `llamafactory-cli` from it. The venv also holds
what the generated YAML asks for beyond LLaMA-Factory's own requirements (its `report_to` logger). uv (a memrl
dependency) creates and fills it: about 30 s where pip took two minutes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from memrl.core.errors import MemrlError
from memrl.core.models import cache_dir

LLAMAFACTORY_VERSION = "0.9.5"
# What the YAML `backends.llamafactory.sft_yaml` writes may name beyond LLaMA-Factory's own requirements, at memrl's
# ranges: each logger `report_to` may name, and on GPU machines the ZeRO-2 config of a multi-GPU run.
REPORT_PACKAGES = {"none": (), "wandb": ("wandb>=0.31,<0.32",)}
GPU_PACKAGES = ("deepspeed>=0.19.8,<0.20",)
# LLaMA-Factory 0.9.5 admits transformers 5.6.0, which verl excludes and later LLaMA-Factory releases exclude too.
PINS = ("transformers>=4.55,<5.6",)
_READY = ".memrl-ready"


@dataclass(frozen=True)
class Step:
    description: str
    argv: list[str]


def default_env_dir() -> Path:
    return cache_dir() / "envs" / "llamafactory"


def cli_path(env_dir: Path) -> Path:
    return env_dir / "bin" / "llamafactory-cli"


def _torch_spec() -> tuple[str, bool]:
    """The running torch version (so both environments agree) and whether it is a CPU build."""
    import torch

    version = torch.__version__.split("+")[0]
    return version, not torch.cuda.is_available() and "+cu" not in torch.__version__


def constraints(torch_version: str) -> str:
    """The environment's constraints file: every pip call (build environments too) keeps these."""
    return "".join(f"{line}\n" for line in (f"torch=={torch_version}", *PINS))


def requirements(cpu: bool) -> list[str]:
    """LLaMA-Factory, every logger the YAML may report to and, on GPU machines, DeepSpeed."""
    extra = sorted({req for reqs in REPORT_PACKAGES.values() for req in reqs})
    return [f"llamafactory=={LLAMAFACTORY_VERSION}", *extra, *(() if cpu else GPU_PACKAGES)]


def _uv() -> str:
    from uv import find_uv_bin

    return str(find_uv_bin())


def plan(env_dir: Path) -> list[Step]:
    """The commands that create the environment, the venv first."""
    py = str(env_dir / "bin" / "python")
    uv_pip = [_uv(), "pip"]
    constraint = str(env_dir / "constraints.txt")
    # The machine's local wheels (PIP_FIND_LINKS: where a CPU torch may wait) count for uv as they do for pip.
    links = [arg for folder in os.environ.get("PIP_FIND_LINKS", "").split() for arg in ("--find-links", folder)]
    torch_version, cpu = _torch_spec()
    venv = [_uv(), "venv", "--quiet", "--clear", "--seed", "--python", sys.executable, str(env_dir)]
    # Build environments keep the constraints too, or a source build pulls a CUDA torch.
    install = [*uv_pip, "install", "-q", "--python", py, *links, "-c", constraint, "--build-constraint", constraint]
    steps = [
        Step(f"create the venv {env_dir}", venv),
        Step(
            f"install torch {torch_version} and llamafactory {LLAMAFACTORY_VERSION}",
            [*install, f"torch=={torch_version}", *requirements(cpu)],
        ),
    ]
    if cpu:
        # Its torchvision/torchaudio wheels are CUDA-linked and break `import transformers` on a CPU torch;
        # its data/mm_plugin.py imports torchaudio unconditionally, so an empty module stands in for it.
        steps += [
            Step(
                "remove CUDA-linked torchvision/torchaudio",
                [*uv_pip, "uninstall", "--quiet", "--python", py, "torchvision", "torchaudio"],
            ),
            Step(
                "add an empty torchaudio module",
                [
                    py,
                    "-c",
                    "import site, pathlib; pathlib.Path(site.getsitepackages()[0], 'torchaudio.py').write_text('')",
                ],
            ),
        ]
    steps.append(Step("check llamafactory-cli", [str(cli_path(env_dir)), "version"]))
    return steps


def ensure_env(
    env_dir: Path | None = None, log: Path | None = None, on_step: Callable[[Step], None] | None = None
) -> Path:
    """Create the environment once (idempotent); return the path of its `llamafactory-cli`."""
    env_dir = (env_dir or default_env_dir()).expanduser().resolve()
    torch_version, cpu = _torch_spec()
    # The marker records what was installed: an environment built to another spec (an older memrl) is rebuilt.
    spec = " ".join([*requirements(cpu), *constraints(torch_version).split()])
    ready = env_dir / _READY
    if ready.is_file() and ready.read_text() == spec:
        return cli_path(env_dir)
    env_dir.mkdir(parents=True, exist_ok=True)
    log = log or env_dir.with_name(f"{env_dir.name}-setup.log")  # beside it: creating the venv clears the folder
    ready.unlink(missing_ok=True)
    with log.open("a") as out:
        for step in (steps := plan(env_dir)):
            if on_step is not None:
                on_step(step)
            out.write(f"$ {' '.join(step.argv)}\n")
            out.flush()
            code = subprocess.call(step.argv, stdout=out, stderr=subprocess.STDOUT, env=_step_env(env_dir))
            if step is steps[0] and code == 0:  # the venv (re)created: its constraints go in now
                (env_dir / "constraints.txt").write_text(constraints(torch_version))
            if code != 0:
                raise MemrlError(
                    f"LLaMA-Factory environment: step '{step.description}' failed (exit {code}); log: {log}"
                )
    ready.write_text(spec)
    return cli_path(env_dir)


def _step_env(env_dir: Path) -> dict[str, str]:
    """This process's environment without what would point the steps elsewhere: the running venv, its path,
    and uv's own settings (a machine-wide constraint or index would steer torch)."""
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"} and not k.startswith("UV_")}
    env["PATH"] = f"{env_dir / 'bin'}:{env.get('PATH', '')}"
    return env
