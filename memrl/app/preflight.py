"""`memrl preflight RECIPE`: what a job needs from this node, checked in seconds before hours depend on it.

Each stage's plan as `--dry-run` builds it (verl's config check and the placement plan included), the packages its
trainer imports (verl's V1 runner with transfer_queue, the attention kernel the overrides name, vLLM, DeepSpeed),
the GPUs it asks for against those torch sees, free GPU memory on the trainer's GPUs against the placement plan,
one real request to each endpoint with its key, a Ray worker's view of the variables the job forwards (only when a
Ray address is given), that the run folder is writable and has room for the checkpoints the stages keep. Every
problem is one line; none means ready.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from memrl.app.config import Recipe
from memrl.core import interrupts
from memrl.core.errors import MemrlError
from memrl.rollout.config import OpenAIModelConfig
from memrl.train.endpoints import Endpoint, is_local

WHOLE_GPU = 0.9  # the share of a GPU's memory that must be free for a trainer that takes the whole GPU
_IMPORT_CHECK = """
import importlib, json, sys
bad = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException as exc:
        bad[name] = (type(exc).__name__ + ": " + str(exc)).splitlines()[0][:200]
print(json.dumps(bad))
"""


@dataclass
class Report:
    checks: list[tuple[str, str]] = field(default_factory=list)  # (what, result) of the checks that passed
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # not in the way of the run, but the user should know


@dataclass
class _Needs:
    modules: dict[str, str] = field(default_factory=dict)  # module -> the stage that needs it
    gpus: dict[str, int] = field(default_factory=dict)  # stage -> GPUs on this node
    plans: dict[str, Any] = field(default_factory=dict)  # stage -> placement Plan
    planned: dict[str, tuple[Any, str]] = field(default_factory=dict)  # stage -> stage_plan()'s (stage, base)
    endpoints: list[Endpoint] = field(default_factory=list)


def preflight(recipe: Recipe, only: list[str] | None = None, ray_address: str | None = None) -> Report:
    """Check what the selected stages of `recipe` need from this node; never starts a job or writes the run."""
    report = Report()
    names = [n for n in recipe.stages if not only or n in only]
    needs = _needs(recipe, names, report)
    _imports(needs.modules, report)
    _gpus(needs, report)
    _endpoints(needs.endpoints, needs.plans, report)
    address = ray_address or next((a for n in names if (a := _ray_address(recipe.stages[n])) is not None), None)
    if address is not None:
        _ray(address, report)
    _writable(recipe.run_dir, report)
    _disk(needs.planned, recipe.run_dir, report)
    return report


def _needs(recipe: Recipe, names: list[str], report: Report) -> _Needs:
    from memrl.app.runner import plan_lines
    from memrl.app.stages.base import inprocess_gpus, model_keys
    from memrl.train.endpoints import stage_endpoints
    from memrl.train.placement import layout, stage_plan
    from memrl.train.registry import stage_backend

    needs = _Needs()
    quiet = Console(file=open(os.devnull, "w"))  # noqa: SIM115 - closed with the context below
    ctx = recipe.context(recipe.run_dir.resolve(), quiet)
    try:
        for name in names:
            stage: Any = recipe.stages[name]
            try:
                # verl's config check and the placement plan, as --dry-run
                text = "\n".join(plan_lines(recipe, ctx, name))
            except MemrlError as exc:
                report.problems.append(f"stage {name}: {exc}")
                continue
            needs.endpoints += [Endpoint(f"{name} {e.role}", e.model) for e in stage_endpoints(stage)]
            for key in model_keys(stage, recipe.models):
                model = recipe.models[key]
                if isinstance(model, OpenAIModelConfig):
                    needs.endpoints.append(Endpoint(f"{name} {key}", model))
            if engines := inprocess_gpus(stage, recipe.models):
                needs.modules.setdefault("vllm", name)
                needs.gpus[name] = engines
            if layout(stage) is not None:  # a trainer: its plan, whichever trainer the stage selects
                base = ctx.model_ref(stage.model)
                needs.plans[name] = placed = stage_plan(stage, base)
                needs.planned[name] = (stage, base)
                report.checks.append((f"placement {name}", placed.lines()[-1].strip()))
            if found := stage_backend(stage):  # what the trainer's own processes need (verl: GPUs and its modules)
                wanted = found[0].needs(stage, text)
                if wanted.gpus:
                    needs.gpus[name] = wanted.gpus
                for module in wanted.modules:
                    needs.modules.setdefault(module, name)
            if getattr(stage, "deepspeed", None):
                needs.modules.setdefault("deepspeed", name)
            if getattr(stage, "distributed", False):
                needs.gpus[name] = stage.cluster.gpus_per_node
    finally:
        ctx.close()
        quiet.file.close()
    if not report.problems:
        report.checks.insert(0, ("plans", f"{', '.join(names)}: as --dry-run builds them"))
    return needs


def _imports(modules: dict[str, str], report: Report) -> None:
    """Import every module in a fresh interpreter (as the job will), one line per module that fails."""
    if not modules:
        return
    argv = [sys.executable, "-W", "ignore", "-c", _IMPORT_CHECK, *modules]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    try:
        bad: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        bad = dict.fromkeys(modules, f"the import check crashed: {done.stderr.strip()[-200:]}")
    for module, error in bad.items():
        report.problems.append(f"package: {module} does not import ({error}); stage {modules[module]} needs it")
    if not bad:
        report.checks.append(("packages", ", ".join(modules)))


def _gpus(needs: _Needs, report: Report) -> None:
    """GPUs torch sees against what each stage asks; free memory on the trainer's GPUs against its plan, and the
    plan again with the GPUs' real memory. TRL and LLaMA-Factory need no GPU (they train on the CPU without one)."""
    if not needs.gpus and not needs.plans:
        return
    import torch

    from memrl.train.placement import stage_plan

    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    short = {name: n for name, n in needs.gpus.items() if n > seen}
    for name, n in short.items():
        what = "no CUDA device" if seen == 0 else f"only {seen}"
        report.problems.append(
            f"GPUs: stage {name} asks for {n} GPU{'s' if n > 1 else ''} on this node; torch sees {what}"
        )
    if short or seen == 0:
        return
    if needs.gpus:
        report.checks.append(("GPUs", f"{seen} visible, {max(needs.gpus.values())} asked"))
    measured = torch.cuda.mem_get_info(0)[1] / 2**30
    for name, placed in needs.plans.items():
        trainer = placed.placed[0]
        # A trainer that takes whole GPUs wants them (nearly) empty: a served model still running there (the 70B
        # after the data stage) fails its load minutes later.
        wanted = trainer.memory_fraction if trainer.memory_fraction is not None else WHOLE_GPU
        for gpu in (g for g in trainer.gpus if g < seen):
            free, total = torch.cuda.mem_get_info(gpu)
            if free < wanted * total:
                report.problems.append(
                    f"GPU memory: stage {name}'s {trainer.role} wants {wanted:g} of GPU {gpu} "
                    f"({wanted * total / 2**30:.0f} GiB); {free / 2**30:.0f} GiB is free (stop what holds it, or "
                    "reserve that GPU for it in the stage's placement)"
                )
        try:  # the recipe's GPU memory is a guess (80 GiB by default); the plan must fit the GPUs that are here
            stage, base = needs.planned[name]
            stage_plan(stage, base, gpu_memory_gib=measured)
        except MemrlError as exc:
            report.problems.append(f"stage {name} on {measured:.0f} GiB GPUs: {exc}")


def _endpoints(endpoints: list[Endpoint], plans: dict[str, Any], report: Report) -> None:
    from memrl.train.endpoints import probe_all

    for name, placed in plans.items():
        for p in placed.placed:
            for url in (u.strip() for u in p.where.split(",") if p.gpus and "://" in u):
                if not is_local(url):
                    report.problems.append(
                        f"stage {name}: {p.role} is placed on GPUs {','.join(map(str, p.gpus))} of this node but its "
                        f"endpoint {url} is another host: set placement.{p.role}: endpoint"
                    )
    if not endpoints:
        return
    failed = probe_all(endpoints)
    report.problems += [f"endpoint: {line}" for line in failed]
    if not failed:
        report.checks.append(("endpoints", ", ".join(sorted({e.model.endpoint for e in endpoints}))))


def _ray_address(stage: Any) -> str | None:
    address = getattr(getattr(stage, "cluster", None), "ray_address", None)
    return None if address is None or address.startswith(("http://", "https://")) else address


def _ray(address: str, report: Report) -> None:
    """One Ray task, started with the variables memrl forwards to verl's workers, reports which of them it sees."""
    try:
        import ray
    except ImportError:
        report.problems.append("ray: not importable, but a Ray address is given")
        return
    from memrl.envs.ray_start import cluster_auth, local_ray, no_auth_warning, probe_ray
    from memrl.train.verl.main import forwarded_env

    wanted = forwarded_env(os.environ | {"WANDB_MODE": os.environ.get("WANDB_MODE", "offline")})
    try:
        if address != "local":
            probe_ray(address)  # seconds, where ray.init would retry for minutes on a server that is not Ray
    except MemrlError as exc:
        report.problems.append(f"ray: {exc}")
        return
    try:
        # A local Ray is this check's own, loopback only and with a token; a cluster is the user's, as it is.
        local = address == "local"
        setup = local_ray() if local else contextlib.nullcontext({"address": address})
        with interrupts.kept(), setup as options:
            ray.init(
                runtime_env={"env_vars": wanted}, **(({"num_cpus": 1, "address": "local"} if local else {}) | options)
            )
        gcs = ray.get_runtime_context().gcs_address
        seen = ray.get(ray.remote(_present).remote(sorted(wanted)))
        if address != "local" and not cluster_auth(gcs):
            report.warnings.append(f"ray: {no_auth_warning(gcs)}")
    except Exception as exc:
        report.problems.append(f"ray: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return
    finally:
        ray.shutdown()
    missing = sorted(set(wanted) - set(seen))
    if missing:
        report.problems.append(f"ray: a worker does not see {', '.join(missing)}")
    else:
        report.checks.append(("ray", f"a worker sees {len(wanted)} forwarded variables"))


def _present(names: list[str]) -> list[str]:
    """Run in a Ray worker: which of `names` its environment holds."""
    return [n for n in names if n in os.environ]


def _existing(path: Path) -> Path:
    """`path`, or the nearest folder above it that exists (a run creates the rest)."""
    existing = path.resolve()
    while not existing.exists():
        existing = existing.parent
    return existing


def _disk(planned: dict[str, tuple[Any, str]], run_dir: Path, report: Report) -> None:
    """The checkpoints and final models the training stages keep (memrl.train.disk) against the run folder's free
    space: a disk that fills up ends a run hours in, at a save."""
    from memrl.train.disk import disk_use

    uses = [u for name, (stage, base) in planned.items() if (u := disk_use(stage, name, base)) is not None]
    if not uses:
        return
    where = _existing(run_dir)
    free = shutil.disk_usage(where).free / 1e9
    need = sum(u.total for u in uses)
    parts = "; ".join(u.line() for u in uses)
    if need > free:
        report.problems.append(
            f"disk: the training stages keep up to ~{need:.0f} GB in {where} ({parts}); {free:.0f} GB is free: "
            "lower stages.<name>.checkpoints.keep, or give output_dir a larger disk"
        )
    else:
        report.checks.append(("disk", f"~{need:.0f} GB of {free:.0f} GB free in {where} ({parts})"))


def _writable(run_dir: Path, report: Report) -> None:
    """The run folder, or the nearest folder above it that exists (a run creates the rest)."""
    existing = _existing(run_dir)
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        report.problems.append(f"output: cannot write under {existing} ({exc.strerror})")
        return
    report.checks.append(("output", f"{run_dir} writable"))
