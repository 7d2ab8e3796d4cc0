"""Shared fixtures: offline, few threads, one model cache and one real server per test session."""

from __future__ import annotations

import os
import subprocess
import sys

os.environ.setdefault("OMP_NUM_THREADS", "2")  # the machine is shared: more threads only thrash
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """$MEMRL_CACHE if the caller set one (CI keeps converted models between steps), else a fresh folder."""
    cache = Path(os.environ.get("MEMRL_CACHE") or tmp_path_factory.mktemp("memrl-cache"))
    os.environ["MEMRL_CACHE"] = str(cache)
    return cache


@pytest.fixture(scope="session")
def tiny_qwen2(model_cache: Path) -> str:
    from memrl.core.models import pull

    return str(pull("tiny-qwen2"))


@pytest.fixture(scope="session")
def tiny_llama(model_cache: Path) -> str:
    from memrl.core.models import pull

    return str(pull("tiny-llama"))


@pytest.fixture(scope="session")
def smoke_run(tiny_qwen2: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`memrl run quickstart --smoke`, every stage on tiny-qwen2: one run the pipeline and resume tests read."""
    run = tmp_path_factory.mktemp("smoke")
    result = subprocess.run(
        [sys.executable, "-m", "memrl", "run", "quickstart", "--smoke", f"output_dir={run}"],
        capture_output=True, text=True, cwd=run, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return run


@pytest.fixture(scope="session")
def smollm2(model_cache: Path) -> str:
    from memrl.core.models import pull

    return str(pull("smollm2"))


@pytest.fixture(scope="session")
def smollm2_server(smollm2: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A real `transformers serve` with the embedded chat model on 127.0.0.1."""
    from memrl.rollout.serve import LocalServer, free_port

    log = tmp_path_factory.mktemp("server") / "serve.log"
    with LocalServer("smollm2", port=free_port(), engine="transformers", log=log) as server:
        yield server
