"""Shared fixtures: offline, few threads, one model cache and one real server per test session."""

from __future__ import annotations

import json
import os
import subprocess
import sys

os.environ.setdefault("OMP_NUM_THREADS", "2")  # the machine is shared: more threads only thrash
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from support import FIXTURES, MemrlCLI, ReflectionRows, ray_head_node, run_memrl

if TYPE_CHECKING:
    from memrl.envs.collab.next_session import NextSessionRow


# Fixtures that cost a minute or more (a pipeline run, a server, a Ray head or cluster, a pip-built environment):
# under `pytest -n` (make test) each worker builds its own, so the tests sharing one stay on one worker (one Ray
# cluster at a time, too: its tests look at every process of the host).
SHARED_ON_ONE_WORKER = ("smoke_run", "llamafactory_venv", "ray_head", "smollm2_server", "mstod_judger", "cluster")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group each test by the first costly session fixture it uses (`--dist loadgroup` keeps a group on one worker);
    the rest spread freely."""
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        shared = next((name for name in SHARED_ON_ONE_WORKER if name in used), None)
        if shared is not None:
            item.add_marker(pytest.mark.xdist_group(shared))


@pytest.fixture(scope="session")
def memrl_cli() -> MemrlCLI:
    """The one way tests run the CLI: `memrl_cli("recipes", "list", cwd=..., env=..., timeout=..., check=...)`."""
    return run_memrl


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
    result = run_memrl("run", "quickstart", "--smoke", f"output_dir={run}", cwd=run, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return run


@pytest.fixture(scope="session")
def mstod_judger_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Judger pairs of the generated MS-TOD fixture, two individuals held out."""
    from memrl.data_gen.config import JudgerDataConfig
    from memrl.data_gen.judger import build_judger_dataset

    out = tmp_path_factory.mktemp("judger-data")
    build_judger_dataset(JudgerDataConfig(tod_dir=FIXTURES / "mstod", eval_individuals=2), out)
    return out


@pytest.fixture(scope="session")
def mstod_judger(mstod_judger_data: Path, tmp_path_factory: pytest.TempPathFactory, model_cache: Path) -> Path:
    """The MiniLM cross-encoder after 2 steps on those pairs: untrained in effect, but a real judger folder the
    scorer loads."""
    from memrl.train.config import JudgerStage
    from memrl.train.hf_trainer import TrainContext
    from memrl.train.judger.trainer import train_judger

    stage = JudgerStage(kind="judger", model="judger", max_steps=2, batch_size=8, micro_batch_size=8, max_length=128)
    out = tmp_path_factory.mktemp("judger")
    return train_judger(stage, "minilm", mstod_judger_data, TrainContext(out, "judger", 0, "none", "mstod-judger"))


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


_CACHE_AT_IMPORT = os.environ.get("MEMRL_CACHE")  # before the model_cache fixture may point it elsewhere


def _ready_llamafactory_venv() -> Path | None:
    candidates = [Path(p) for p in [os.environ.get("MEMRL_LLAMAFACTORY_ENV")] if p]
    if _CACHE_AT_IMPORT:
        candidates.append(Path(_CACHE_AT_IMPORT) / "envs" / "llamafactory")
    candidates += [
        Path(__file__).resolve().parents[1] / ".cache" / "memrl" / "envs" / "llamafactory",
        Path.home() / ".cache" / "memrl" / "envs" / "llamafactory",
    ]
    return next((c for c in candidates if (c / ".memrl-ready").is_file()), None)


@pytest.fixture(scope="session")
def llamafactory_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ready LLaMA-Factory environment: one already built on this machine, else `memrl env llamafactory` builds
    one for the session (pip from the registries, about 2 minutes), which the tests that need it then share."""
    ready = _ready_llamafactory_venv()
    if ready is not None:
        return ready
    env_dir = tmp_path_factory.mktemp("llamafactory") / "env"
    argv = [sys.executable, "-m", "memrl", "env", "llamafactory", "--path", str(env_dir)]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    return env_dir


@pytest.fixture(scope="session")
def ray_head(model_cache: Path) -> Iterator[dict[str, str]]:
    """One local Ray head for the session (opt-in): the env vars that make a CLI's `ray.init()` join it.

    Each `memrl eval ...` run otherwise starts (and stops) its own local Ray, 20-30 s apiece on a loaded machine;
    joining a running head takes about a second. Its processes inherit this env (MEMRL_CACHE, offline, 1 thread),
    so actors see what a CLI-started Ray would give them; as memrl's own local Ray it listens on 127.0.0.1 only and
    takes a token of this session's, which the CLI runs that join it get through their environment, never a file
    (~/.ray/auth_token is any other Ray's). Teardown kills exactly its processes.
    """
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": os.urandom(32).hex()}
    with ray_head_node(auth) as env:
        yield env


@pytest.fixture
def shared_ray(ray_head: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """This test's CLI runs (they inherit os.environ) join the session's Ray head instead of starting their own."""
    for key, value in ray_head.items():
        monkeypatch.setenv(key, value)
    return ray_head


@pytest.fixture
def reflection_rows(tmp_path: Path) -> ReflectionRows:
    """Writes next-session rows as a reflection_data folder's `eval.jsonl` (what the outcome reward reads them from)."""

    def write(rows: Sequence[NextSessionRow]) -> Path:
        data = tmp_path / "data"
        data.mkdir(exist_ok=True)
        fields = ("key", "user_id", "task", "problem_id", "session")
        lines = [{f: getattr(r, f) for f in fields} | {"preferences": list(r.preferences)} for r in rows]
        (data / "eval.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        return data

    return write
