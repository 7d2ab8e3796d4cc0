"""`memrl launch`: a recipe's stages as Ray jobs on a running cluster, one job per stage, each after the last.

Every job runs `memrl run <job recipe> --stage NAME` inside the cluster. The job recipe is the resolved recipe
(environment references kept, never their values) with what a cluster needs filled in: an absolute output folder,
collab actors spread over the cluster (`ray_address: auto`), verl joining the cluster instead of starting its own
Ray. It is written under `.memrl-launch/` in the current directory, which Ray uploads as the job's working dir.
Environment variables travel only inside the submission (`runtime_env.env_vars`, sent in-process through Ray's job
client): never into a file or a command line, and masked as `***` when printed, by name (any key, token, password,
secret or credential) and by value (any secret the recipe or the environment holds, wherever it appears).

`--ray-address` is the job server (`http://HOST:8265`, the dashboard) or the GCS (`HOST:PORT`, as `ray start
--address` takes it); for the GCS form the dashboard address is read from the cluster itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import io
import json
import os
import shlex
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from rich.console import Console

from memrl.app.config import Recipe
from memrl.app.recipe import LoadedRecipe, interpolate
from memrl.core.envrefs import referenced_names
from memrl.core.errors import ConfigError, MemrlError, first_line
from memrl.core.schema import describe_error
from memrl.core.secrets import MASK, is_secret_name, redact
from memrl.train import ray_jobs

LAUNCH_DIR = ".memrl-launch"
ENV_PREFIXES = ("WANDB_", "HF_", "MEMRL_")
ENV_NAMES = ("OMP_NUM_THREADS", "TOKENIZERS_PARALLELISM")
# Folders and files Ray must not upload: environments, caches, run outputs, weights. memrl's own source folders are
# left out too: the job imports the memrl installed on the node, and a copy of the source tree on the job's
# PYTHONPATH would shadow that install (the layer folders are not importable bare).
EXCLUDES = [
    ".venv",
    "venv",
    ".cache",
    "runs",
    ".git",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    "wandb",
    "checkpoints",
    "*.safetensors",
    "*.gguf",
    "*.bin",
    "*.pt",
    "*.pth",
    "*.ckpt",
]
SOURCE_FOLDERS = ("memrl", "train", "rollout", "rewards", "envs", "data_gen", "recipes")
# Drivers inside the job (the collab runner, verl's main_ppo) pass their own runtime_env to ray.init; Ray refuses
# to merge it with the job's when both set the same variable unless this is set.
RAY_MERGE_ENV = {"RAY_OVERRIDE_JOB_RUNTIME_ENV": "1"}


class StageFailed(MemrlError):
    """A stage's Ray job ended without success (the launch stops; exit status 1, not 2)."""


# ---- the cluster address -------------------------------------------------------------------------------------------


def dashboard_url(address: str, timeout: float = 5.0) -> str:
    """The job server's URL for `--ray-address`: given as http(s)://, or read from the GCS at HOST:PORT."""
    from memrl.envs.ray_start import probe_ray

    address = check_address(address)
    if address.startswith(("http://", "https://")):
        _probe_http(address, timeout)
        return address
    probe_ray(address)
    url = "http://" + _dashboard_from_gcs(address)
    _probe_http(url, timeout)
    return url


def check_address(address: str) -> str:
    """`--ray-address` of a form the launch takes (checked without connecting, so a dry run refuses garbage too):
    http(s)://HOST[:PORT] or HOST:PORT; without its trailing slash."""
    clean = address.strip().rstrip("/")
    if clean.startswith(("http://", "https://")):
        parts = urllib.parse.urlsplit(clean)
        with contextlib.suppress(ValueError):  # `.port` of a port that is no number, or past 65535
            if parts.hostname and parts.port != 0:
                return clean
    elif "://" not in clean:
        host, _, port = clean.rpartition(":")
        if host and not any(c.isspace() for c in host) and port.isascii() and port.isdigit() and 0 < int(port) < 2**16:
            return clean
    raise ConfigError(
        f"--ray-address {address!r}: give the job server (http://HOST:8265) or the GCS address (HOST:PORT)"
    )


def _dashboard_from_gcs(gcs: str) -> str:
    from ray._raylet import GcsClient  # type: ignore[attr-defined]

    try:
        client = GcsClient(address=gcs)
        raw = client.internal_kv_get(b"dashboard", namespace=b"dashboard", timeout=10)
    except Exception as exc:
        raise MemrlError(f"cannot connect to the Ray cluster at {gcs}: {first_line(exc)}") from None
    if not raw:
        raise MemrlError(
            f"the Ray cluster at {gcs} runs no dashboard (job server): start its head with "
            "`--include-dashboard true`, or pass --ray-address http://HOST:8265"
        )
    host, _, port = raw.decode().rpartition(":")
    if host in ("", "0.0.0.0", "::"):
        host = gcs.rpartition(":")[0]  # bound to every interface: reachable where the GCS is
    return f"{host}:{port}"


def _probe_http(url: str, timeout: float) -> None:
    """Fail in one line unless a Ray job server answers at `url`: nothing listening, a server that speaks no HTTP
    (BadStatusLine), or one that is not Ray's (its /api/version is no JSON naming a Ray version)."""
    from memrl.envs.ray_start import no_token_line, token_headers

    request = urllib.request.Request(f"{url}/api/version", headers=token_headers())
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            version = json.loads(reply.read(2**16))
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):  # a cluster with token authentication, and this shell holds no (or another) token
            raise MemrlError(no_token_line(url)) from None
        raise MemrlError(f"cannot reach the Ray job server at {url}: {exc.reason or exc.code}") from None
    except (urllib.error.URLError, OSError, ValueError, RecursionError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        raise MemrlError(f"cannot reach the Ray job server at {url}: {reason or type(exc).__name__}") from None
    if not isinstance(version, dict) or "ray_version" not in version:
        raise MemrlError(f"{url} is not a Ray job server: its /api/version names no Ray version")


# ---- what travels with each job ------------------------------------------------------------------------------------


def passthrough_env(environ: Mapping[str, str], referenced: Sequence[str] = ()) -> dict[str, str]:
    """The caller's WANDB_*, HF_*, MEMRL_*, OMP_NUM_THREADS, TOKENIZERS_PARALLELISM, and every variable the recipe
    references as ${NAME}, where set."""
    names = {n for n in environ if n.startswith(ENV_PREFIXES) or n in ENV_NAMES}
    names |= {n for n in referenced if n in environ}
    return {n: environ[n] for n in sorted(names)} | RAY_MERGE_ENV


def masked(env: Mapping[str, str]) -> dict[str, str]:
    """Secret-named variables as MASK; in the others, any secret value (say, a key inside a URL) masked too."""
    return {k: (MASK if is_secret_name(k) else redact(v)) for k, v in env.items()}


def excludes(working_dir: Path, run_dir: Path) -> list[str]:
    out = list(EXCLUDES)
    if (working_dir / "memrl" / "__init__.py").is_file() and (working_dir / "pyproject.toml").is_file():
        out += [f"/{name}" for name in SOURCE_FOLDERS]
    if run_dir.is_relative_to(working_dir) and run_dir != working_dir:
        inside = run_dir.relative_to(working_dir)
        if inside.parts[0] not in out:  # outputs already excluded by name (runs/...) need no line of their own
            out.append("/" + inside.as_posix())
    return out


def referenced_env(loaded: LoadedRecipe) -> list[str]:
    return sorted({name for template in loaded.env_templates.values() for name in referenced_names(template)})


# ---- the job recipe ------------------------------------------------------------------------------------------------


@dataclass
class JobPlan:
    """What `memrl launch` submits: one recipe file, one runtime_env, one entrypoint per stage."""

    recipe: Recipe
    text: str  # the job recipe as YAML (environment references, no values)
    path: Path  # where it goes, relative to the working dir
    runtime_env: dict[str, Any]
    stages: list[str]
    gpus: dict[str, int]  # stage -> GPUs the job's own process needs (torchrun, in-process vLLM on the job's node)
    gpus_if_any: dict[str, int]  # stage -> GPUs it takes where the cluster has some (stages.base.Job.gpus_if_any)
    notes: list[str]

    def entrypoint_gpus(self, stage: str, node_gpus: int) -> int:
        """The GPUs the stage's job asks Ray for on a cluster whose largest node holds `node_gpus` (0: none asked)."""
        return max(self.gpus.get(stage, 0), min(self.gpus_if_any.get(stage, 0), node_gpus))

    def entrypoint(self, stage: str) -> str:
        return f"memrl run {shlex.quote(self.path.as_posix())} --stage {shlex.quote(stage)}"

    def shown_env(self) -> dict[str, Any]:
        return self.runtime_env | {"env_vars": masked(self.runtime_env.get("env_vars", {}))}


def job_recipe(
    loaded: LoadedRecipe, dashboard: str
) -> tuple[dict[str, Any], dict[str, int], dict[str, int], list[str]]:
    """The resolved recipe, adapted to run stage by stage inside Ray jobs; GPUs per job, always and where the cluster
    has some; notes for the user."""
    from memrl.app.stages.base import inprocess_gpus
    from memrl.app.stages.registry import kind_of

    recipe = loaded.recipe
    data = loaded.resolved()
    data["output_dir"] = str(recipe.run_dir.resolve())  # the jobs' cwd is Ray's copy of the working dir
    gpus: dict[str, int] = {}
    gpus_if_any: dict[str, int] = {}
    notes: list[str] = []
    for name, stage in recipe.stages.items():
        job = kind_of(stage).job(stage, data["stages"][name], name, dashboard)
        if asked := max(job.gpus, inprocess_gpus(stage, recipe.models)):
            gpus[name] = asked
        if job.gpus_if_any > asked:
            gpus_if_any[name] = job.gpus_if_any
        notes += job.notes
    return data, gpus, gpus_if_any, notes


def validate_job_recipe(data: dict[str, Any], name: str) -> LoadedRecipe:
    resolved, templates = interpolate(data)
    try:
        recipe = Recipe.model_validate(resolved)
    except ValidationError as exc:
        raise ConfigError(f"job recipe for {name}: {describe_error(exc, Recipe)}") from None
    return LoadedRecipe(recipe, Path(f"{LAUNCH_DIR}/{name}.yaml"), templates)


def plan(
    loaded: LoadedRecipe,
    dashboard: str,
    only: Sequence[str] | None = None,
    working_dir: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> JobPlan:
    recipe = loaded.recipe
    unknown = sorted(set(only or []) - set(recipe.stages))
    if unknown:
        raise ConfigError(f"no stage named {unknown[0]!r} in recipe {recipe.name!r} (have: {', '.join(recipe.stages)})")
    working_dir = (working_dir or Path.cwd()).resolve()
    environ = os.environ if environ is None else environ
    dashboard = check_address(dashboard)  # a dry run plans for an address it never connects to
    data, gpus, gpus_if_any, notes = job_recipe(loaded, dashboard)
    job = validate_job_recipe(data, recipe.name)
    text = yaml.safe_dump(data, sort_keys=False)
    digest = hashlib.sha1(text.encode()).hexdigest()[:8]
    runtime_env = {
        "working_dir": str(working_dir),
        "excludes": excludes(working_dir, recipe.run_dir.resolve()),
        "env_vars": passthrough_env(environ, referenced_env(loaded)),
    }
    stages = [name for name in recipe.stages if not only or name in only]
    path = Path(LAUNCH_DIR) / f"{recipe.name}-{digest}.yaml"
    return JobPlan(job.recipe, text, path, runtime_env, stages, gpus, gpus_if_any, notes)


# ---- dry run -------------------------------------------------------------------------------------------------------


def describe(job: JobPlan, address: str, echo: Any) -> None:
    """Print, stage by stage, the job's entrypoint, its runtime_env (secrets masked) and what the stage runs."""
    from memrl.app.runner import plan_lines

    def say(line: str) -> None:
        echo(redact(line))  # a stage's plan may quote a URL or a value holding a key

    say(f"launch {job.recipe.name!r} on {address} (dry run: nothing is submitted or written)")
    say(f"job recipe: {job.path} (written at launch; outputs in {job.recipe.run_dir})")
    for note in job.notes:
        say(f"note: {note}")
    shown = json.dumps(job.shown_env(), sort_keys=True)
    ctx = job.recipe.context(job.recipe.run_dir, Console(file=io.StringIO()))
    for name in job.stages:
        stage = job.recipe.stages[name]
        say(f"\nstage {name} ({stage.kind}): Ray job")
        say(f"  entrypoint: {job.entrypoint(name)}")
        least, most = job.gpus.get(name, 0), job.gpus_if_any.get(name, 0)
        if most:
            say(f"  entrypoint GPUs: {least} to {most}, as many as the cluster's largest node has")
        elif least:
            say(f"  entrypoint GPUs: {least}")
        say(f"  runtime_env: {shown}")
        for block in plan_lines(job.recipe, ctx, name):
            for line in block.splitlines():
                say(f"  | {line}")


# ---- submission ----------------------------------------------------------------------------------------------------


def launch(job: JobPlan, dashboard: str, console: Console, write: Any = None) -> None:
    """Write the job recipe, then submit each stage and wait for it, streaming its logs; a failure stops here."""
    write = write or _write_stdout
    target = Path(job.runtime_env["working_dir"]) / job.path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(job.text)
    for note in job.notes:
        console.print(f"note: {note}", highlight=False)
    client = ray_jobs.connect(dashboard)
    node_gpus = ray_jobs.node_gpus(dashboard) if set(job.stages) & set(job.gpus_if_any) else 0
    for name in job.stages:
        console.rule(f"stage {name}")
        try:
            job_id = client.submit_job(
                entrypoint=job.entrypoint(name),
                runtime_env=job.runtime_env,
                metadata={"memrl_recipe": job.recipe.name, "memrl_stage": name},
                entrypoint_num_gpus=job.entrypoint_gpus(name, node_gpus) or None,
            )
        except Exception as exc:
            raise MemrlError(f"stage {name}: the Ray job server refused the job: {first_line(exc)}") from None
        console.print(f"stage {name}: Ray job {job_id}", highlight=False)
        try:
            status, message = ray_jobs.follow(client, job_id, write)
        except KeyboardInterrupt:
            console.print(f"stage {name}: stopped Ray job {job_id}", highlight=False)
            raise
        if status != "SUCCEEDED":
            why = f": {first_line(Exception(message))}" if message else ""
            raise StageFailed(f"stage {name} failed: Ray job {job_id} {status.lower()}{why}")


def _write_stdout(text: str) -> None:
    sys.stdout.write(redact(text))
    sys.stdout.flush()
