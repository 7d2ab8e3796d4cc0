"""The folders install under the memrl namespace, editable and as a wheel; nothing installs bare. pyproject declares
what the code imports, keeps GPU packages and verl's test tools out of the CPU install, and the pinned sets
(constraints/cpu.txt, constraints/gpu.txt) agree with it."""

from __future__ import annotations

import ast
import importlib.util
import socket
import subprocess
import sys
import time
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
LAYERS = ("train", "rollout", "rewards", "envs", "data_gen")
IMPORT_ALL = "import memrl.envs, memrl.rewards, memrl.train, memrl.rollout, memrl.data_gen"


def _python(code: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, check=True)
    return out.stdout


def test_editable_install_maps_folders_into_namespace(tmp_path: Path) -> None:
    code = IMPORT_ALL + "; import memrl.train as t, memrl.rollout as r; print(t.__file__); print(r.__file__)"
    train_file, rollout_file = _python(code, cwd=tmp_path).split()
    assert Path(train_file) == REPO / "train" / "__init__.py"
    assert Path(rollout_file) == REPO / "rollout" / "__init__.py"


def test_layers_are_not_importable_bare(tmp_path: Path) -> None:
    code = "import importlib.util; print([importlib.util.find_spec(n) is None for n in ('envs', 'train', 'rollout')])"
    assert _python(code, cwd=tmp_path).strip() == "[True, True, True]"


def test_built_wheel_imports_and_ships_recipes(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("memrl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.split("/")[0] in (*LAYERS, "recipes", "tests")]
    assert "memrl/recipes/quickstart.yaml" in names
    assert "memrl/rollout/openai_http.py" in names

    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
    )
    code = (
        IMPORT_ALL + "; import memrl.train as t; from memrl.app.recipe import bundled_recipes; "
        "print(t.__file__); print(sorted(bundled_recipes()))"
    )
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    train_file, recipes = _python(code, cwd=tmp_path, env=env).split("\n", 1)
    assert Path(train_file).is_relative_to(site)
    assert "quickstart" in recipes


# --- what pyproject declares: every import, the extras, the pinned sets ------------------------------------------

SOURCES = ("memrl", *LAYERS)
GPU_TXT = REPO / "constraints" / "gpu.txt"
CPU_TXT = REPO / "constraints" / "cpu.txt"
CPU_EXTRAS = ("dev", "serve", "verl", "openenv", "verifiers")  # what the Makefile installs on CPU
GPU_EXTRAS = ("gpu",)
# Imported where installed, but absent on CPU machines: no local metadata to map the module to its distribution.
NOT_INSTALLED_HERE = {"vllm": "vllm"}
TYPING_ONLY = {"_typeshed"}  # typeshed's names for annotations, no package behind them


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _requirements(extras: tuple[str, ...] = ()) -> list[Requirement]:
    """pyproject's dependencies plus those of `extras`, with `memrl[...]` self-references expanded."""
    optional = _project()["optional-dependencies"]
    out = [Requirement(r) for r in _project()["dependencies"]]
    todo, seen = list(extras), set()
    while todo:
        if (extra := todo.pop()) in seen:
            continue
        seen.add(extra)
        for req in map(Requirement, optional[extra]):
            if canonicalize_name(req.name) == "memrl":
                todo += req.extras
            else:
                out.append(req)
    return out


def _closure(roots: list[Requirement]) -> set[str]:
    """Every distribution `roots` pull in, walked through the installed metadata (offline)."""
    seen: set[tuple[str, str]] = set()
    todo = [(req, "") for req in roots]
    while todo:
        req, parent_extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": parent_extra}):
            continue
        name = canonicalize_name(req.name)
        for extra in ("", *req.extras):
            if (name, extra) in seen:
                continue
            seen.add((name, extra))
            try:
                requires = metadata.requires(name) or []
            except metadata.PackageNotFoundError:
                continue  # a GPU-only package: named, not walked
            todo += [(Requirement(r), extra) for r in requires]
    return {name for name, _ in seen}


def _imports() -> dict[str, set[str]]:
    """Third-party top-level modules the sources import (in functions too) -> the files importing them."""
    found: dict[str, set[str]] = {}
    for folder in SOURCES:
        for file in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(file.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for top in {n.split(".")[0] for n in names} - {"memrl"} - TYPING_ONLY - sys.stdlib_module_names:
                    found.setdefault(top, set()).add(str(file.relative_to(REPO)))
    return found


def test_every_third_party_import_is_declared() -> None:
    """Each module the code imports belongs to a distribution pyproject names (dependencies or an extra)."""
    declared = {canonicalize_name(r.name) for r in _requirements(tuple(_project()["optional-dependencies"]))}
    owners = metadata.packages_distributions()
    undeclared = {}
    for module, files in _imports().items():
        dists = {canonicalize_name(d) for d in owners.get(module, [])} or {NOT_INSTALLED_HERE.get(module, module)}
        if not dists & declared:
            undeclared[module] = f"{sorted(dists)} imported in {sorted(files)}"
    assert not undeclared, f"declare in pyproject: {undeclared}"


def test_cpu_install_leaves_out_gpu_packages_and_verls_test_tools() -> None:
    cpu = _closure(_requirements(CPU_EXTRAS))
    assert {"verl", "tensordict", "cachetools", "uvicorn", "scikit-learn", "numpy"} <= cpu
    unwanted = {"deepspeed", "vllm", "torchcodec", "nvtx", "qwen-vl-utils", "pytest-asyncio", "pytest-rerunfailures"}
    assert cpu & unwanted == set()
    assert {"deepspeed", "vllm", "verl"} <= _closure(_requirements(GPU_EXTRAS))


# What TaskRunnerV1 (verl.trainer.main_ppo) imports on its way to training, and what its Ray workers import: the V1
# trainers and agent-loop workers over TransferQueue, the FSDP engine workers, the rollout client, the reward loop,
# the SFT trainers, the legacy Ray trainer, and memrl's modules that VERL_USE_EXTERNAL_MODULES names (and its check).
VERL_MODULES = (
    "transfer_queue",
    "verl.trainer.main_ppo",
    "verl.trainer.ppo.ray_trainer",
    "verl.trainer.ppo.v1",
    "verl.trainer.ppo.v1.trainer_sync",
    "verl.trainer.ppo.v1.agent_loop_tq",
    "verl.trainer.ppo.v1.replay_buffer",
    "verl.workers.engine_workers",
    "verl.workers.engine.fsdp.transformer_impl",
    "verl.workers.rollout.llm_server",
    "verl.experimental.agent_loop",
    "verl.experimental.reward_loop",
    "verl.checkpoint_engine",
    "verl.trainer.sft_trainer",
    "verl.trainer.sft_trainer_ray",
    "memrl.train.verl.advantage",
    "memrl.train.verl.agent_loop",
    "memrl.train.verl.validate",
)


@pytest.mark.slow  # about 20 s of imports (torch, ray, verl)
def test_verl_trainers_import_without_verl_core() -> None:
    """What verl's `verl-core` extra adds beyond memrl's CPU install is absent, and every module of verl's V1 runner,
    its workers and its trainers still imports (one interpreter for test_verl_rehearsal's list and this one's)."""
    core = _closure([Requirement("verl[verl-core]")]) - _closure(_requirements(CPU_EXTRAS))
    assert {"torchcodec", "nvtx", "qwen-vl-utils"} <= core
    assert {"cachetools", "uvicorn", "fastapi"}.isdisjoint(core)  # declared by memrl's verl extra
    # Blocked by module name: those installed (an older venv) by their owners, the rest by their usual names.
    owners = metadata.packages_distributions()
    installed = {m for m, dists in owners.items() if {canonicalize_name(d) for d in dists} & core}
    blocked = sorted(installed | {"torchcodec", "nvtx", "qwen_vl_utils"})
    code = (
        f"import importlib, sys; sys.modules.update(dict.fromkeys({blocked!r}))\n"  # None in sys.modules: it fails
        f"for name in {VERL_MODULES!r}: importlib.import_module(name)\n"
        "from verl.trainer.main_ppo import TaskRunnerV1\n"
        "from verl.trainer.ppo.v1 import get_trainer_cls\n"
        "print(get_trainer_cls('sync').__name__)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("PPOTrainerSync")


def test_pytest_settings_need_no_plugin_the_dev_extra_lacks(tmp_path: Path) -> None:
    """A setting for a plugin memrl does not install is a no-op at best, an unknown-option warning at worst."""
    dev = _closure(_requirements(("dev",)))
    foreign = [
        ep.name
        for ep in metadata.entry_points(group="pytest11")
        if ep.dist is not None and canonicalize_name(ep.dist.name) not in dev
    ]
    argv = [sys.executable, "-m", "pytest", *(f"-pno:{name}" for name in foreign), "--co", "-q"]
    argv.append(f"{Path(__file__).relative_to(REPO)}::test_layers_are_not_importable_bare")
    out = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "Unknown config option" not in out.stdout + out.stderr


def _pins(path: Path) -> dict[str, Version]:
    pins = {}
    for raw in path.read_text().splitlines():
        if line := raw.split("#", 1)[0].strip():
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = Version(version)
    return pins


@pytest.mark.parametrize(("pinned", "extras"), [(CPU_TXT, CPU_EXTRAS), (GPU_TXT, GPU_EXTRAS)])
def test_constraints_agree_with_pyproject(pinned: Path, extras: tuple[str, ...]) -> None:
    pins = _pins(pinned)
    wrong = [
        f"{req} vs {pins[name]}"
        for req in _requirements(extras)
        if (name := canonicalize_name(req.name)) in pins and not req.specifier.contains(pins[name], prereleases=True)
    ]
    assert not wrong, f"{pinned.name} pins versions pyproject excludes: {wrong}"
    if pinned == CPU_TXT:  # the CPU set is installed here and can be walked: a pin it never pulls in is stale
        stale = set(pins) - _closure(_requirements(extras))
        assert not stale, f"{pinned.name} pins what the CPU install leaves out: {sorted(stale)}"


def test_gpu_set_is_locked_and_documented() -> None:
    """constraints/gpu.txt pins every requirement of `.[gpu]`; README's GPU section names its headline versions."""
    pins = _pins(GPU_TXT)
    assert {canonicalize_name(r.name) for r in _requirements(GPU_EXTRAS)} <= set(pins)
    readme = (REPO / "README.md").read_text().split("## GPU clusters", 1)[1].split("\n## ", 1)[0]
    for name in ("torch", "vllm", "transformers", "flashinfer-python"):
        assert f"{name}=={pins[name]}" in readme, f"README's GPU section should name {name}=={pins[name]}"
    assert "constraints/gpu.txt" in readme


def _index_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _index_reachable(), reason="resolving against PyPI needs the network")
def test_gpu_constraints_resolve() -> None:
    """`.[gpu]` resolves for linux x86_64 within constraints/gpu.txt, to exactly that set (nothing unpinned)."""
    spec = importlib.util.spec_from_file_location("lock_gpu", REPO / "tools" / "lock_gpu.py")
    assert spec is not None and spec.loader is not None
    lock = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lock)
    started = time.monotonic()
    resolved = {name: Version(v) for name, v in lock.resolve(constraints=GPU_TXT).items()}
    print(f"resolved {len(resolved)} packages in {time.monotonic() - started:.0f}s")
    assert resolved == _pins(GPU_TXT)
