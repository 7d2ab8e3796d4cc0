"""The `memrl` command. Heavy imports stay inside commands so `--help` is instant: the groups whose commands import
every world's actions (`memrl eval`, `memrl data`, ...) are lazy groups (`LazyGroup`), whose modules are imported only
when the group runs or shows its help; the root's help lists each by the name and help given here."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import sys
from collections.abc import MutableMapping, Sequence
from pathlib import Path
from typing import Annotated, ClassVar, NoReturn

import typer
import typer.main
import yaml
from rich.console import Console
from rich.table import Table
from typer import _click  # typer vendors click: its groups hold these types, not the `click` package's
from typer.core import TyperGroup

from memrl.app.cli.errors import print_redacted, user_error
from memrl.app.cli.from_config import sane_number
from memrl.app.cli.preflight import preflight
from memrl.app.cli.reflector import export
from memrl.app.context import redact_console
from memrl.core import interrupts
from memrl.core.errors import MemrlError


class LazyGroup(TyperGroup):
    """A group whose commands are those of the `typer.Typer` at `source` ("module:attribute"), imported the first time
    anything reads them (running the group, its help, a test listing them); its name and help are known without."""

    source: ClassVar[str]
    _loaded: dict[str, _click.Command] | None = None

    @property
    def commands(self) -> MutableMapping[str, _click.Command]:
        if self._loaded is None:
            module, _, name = self.source.partition(":")
            self._loaded = dict(typer.main.get_group(getattr(importlib.import_module(module), name)).commands)
        return self._loaded

    @commands.setter
    def commands(self, given: MutableMapping[str, _click.Command]) -> None:
        if given:  # typer builds the group empty: its commands are the source's
            raise TypeError(f"{type(self).__name__} takes its commands from {self.source}")


def lazy_group(source: str, help: str) -> typer.Typer:
    """The `typer.Typer` to `add_typer` for a group whose commands are the ones of `source` ("module:attribute"); its
    `help` shows in `memrl --help` and the group's own help."""
    cls = type(f"LazyGroup[{source}]", (LazyGroup,), {"source": source})
    return typer.Typer(cls=cls, help=help, no_args_is_help=True)


app = typer.Typer(
    help="memrl: train the memory of long-term conversational agents with reinforcement learning.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
recipes_app = typer.Typer(help="List and inspect recipes.", no_args_is_help=True)
models_app = typer.Typer(help="Embedded offline models.", no_args_is_help=True)
env_app = typer.Typer(help="Separate environments for tools whose pins clash with memrl's.", no_args_is_help=True)
app.add_typer(recipes_app, name="recipes")
app.add_typer(models_app, name="models")
app.add_typer(env_app, name="env")
# The groups whose commands import the worlds' modules: each is imported when it runs or shows its help.
LAZY_GROUPS = {
    "collab": ("memrl.app.cli.collab:collab_app", "MultiSessionCollab: preferences, checkers, comparisons."),
    "pahf": ("memrl.app.cli.pahf:pahf_app", "PAHF continual personalization: the rule-based shopping user."),
    "eval": ("memrl.app.cli.eval:eval_app", "Evaluate agents in the simulated environments."),
    "data": ("memrl.app.cli.data:data_app", "Build training datasets from environment runs."),
    "reward": ("memrl.app.cli.reward:reward_app", "The rewards: list them, score a reflection."),
    "world": ("memrl.app.cli.world:world_app", "memrl's worlds for other trainers: OpenEnv servers."),
}
for _name, (_source, _help) in LAZY_GROUPS.items():
    app.add_typer(lazy_group(_source, _help), name=_name)

app.command("export")(export)
app.command("preflight")(preflight)

console = Console(stderr=True)
redact_console(console)
_debug = False

TYPER_INTERRUPTED = 130  # what typer returns for a KeyboardInterrupt it caught (our SIGINT or SIGTERM)
Overrides = Annotated[list[str] | None, typer.Argument(help="dotted.key=value overrides", show_default=False)]


@app.callback()
def _root(debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False) -> None:
    global _debug
    _debug = debug


# ---- run / recipes -------------------------------------------------------------------------------------------


@app.command()
def run(
    recipe: Annotated[str, typer.Argument(help="bundled recipe name or path to a YAML file")],
    overrides: Overrides = None,
    stage: Annotated[list[str] | None, typer.Option("--stage", help="run only these stages (repeatable)")] = None,
    smoke: Annotated[
        bool, typer.Option("--smoke", help="apply the recipe's smoke overrides: tiny model, few steps")
    ] = (False),
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print what each stage would run (verl: the command)")] = (
        False
    ),
) -> None:
    """Run a recipe's stages in order; writes the resolved recipe next to the outputs. A rerun resumes."""
    from memrl.app.recipe import load_recipe
    from memrl.app.runner import run_recipe

    run_dir = run_recipe(load_recipe(recipe, overrides or [], smoke=smoke), console, only=stage, dry_run=dry_run)
    console.print(f"done: {run_dir}")


@app.command()
def resume(
    run_dir: Annotated[Path, typer.Argument(help="a run folder: holds the run's recipe.resolved.yaml")],
    stage: Annotated[list[str] | None, typer.Option("--stage", help="resume only these stages (repeatable)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print what each stage would run")] = False,
) -> None:
    """Rerun the run saved in RUN_DIR: finished stages are skipped, a killed one continues from its last checkpoint."""
    from memrl.app.runner import resume_run

    console.print(f"done: {resume_run(run_dir, console, only=stage, dry_run=dry_run)}")


@app.command()
def launch(
    recipe: Annotated[str, typer.Argument(help="bundled recipe name or path to a YAML file")],
    ray_address: Annotated[
        str, typer.Option("--ray-address", help="job server http://HOST:8265, or the GCS HOST:PORT", show_default=False)
    ],
    overrides: Overrides = None,
    stage: Annotated[list[str] | None, typer.Option("--stage", help="launch only these stages (repeatable)")] = None,
    smoke: Annotated[bool, typer.Option("--smoke", help="apply the recipe's smoke overrides")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="print each stage's job: entrypoint, runtime_env, command")
    ] = False,
) -> None:
    """Submit a recipe's stages to a Ray cluster as jobs, one per stage, in order. A relaunch resumes."""
    from memrl.app.launch import StageFailed, dashboard_url, describe, plan
    from memrl.app.launch import launch as submit
    from memrl.app.recipe import load_recipe
    from memrl.envs.ray_start import job_server_auth, no_auth_warning

    loaded = load_recipe(recipe, overrides or [], smoke=smoke)
    if dry_run:
        describe(plan(loaded, ray_address, only=stage), ray_address, typer.echo)
        return
    dashboard = dashboard_url(ray_address)
    if not job_server_auth(dashboard):  # a warning, not a refusal: the cluster is the user's
        print(f"memrl: warning: {no_auth_warning(dashboard)}", file=sys.stderr)
    job = plan(loaded, dashboard, only=stage)
    try:
        submit(job, dashboard, console)
    except StageFailed as exc:
        print(f"memrl: error: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None
    console.print(f"done: {job.recipe.run_dir}")


@recipes_app.command("list")
def recipes_list() -> None:
    """Recipes shipped with memrl."""
    from memrl.app.recipe import bundled_recipes, compose

    table = Table("name", "description")
    for name, path in sorted(bundled_recipes().items()):
        table.add_row(name, str(compose(path).get("description", "")))
    Console().print(table)


@recipes_app.command("show")
def recipes_show(
    recipe: Annotated[str, typer.Argument(help="bundled recipe name or path to a YAML file")],
    overrides: Overrides = None,
) -> None:
    """Print the resolved, validated recipe (environment references kept, secrets never shown)."""
    from memrl.app.recipe import load_recipe

    loaded = load_recipe(recipe, overrides or [])
    typer.echo(yaml.safe_dump(loaded.resolved(), sort_keys=False), nl=False)


# ---- models ---------------------------------------------------------------------------------------------------


@models_app.command("list")
def models_list() -> None:
    """Embedded models and whether they are prepared."""
    from memrl.core import models

    table = Table("name", "aliases", "kind", "prepared", "description")
    for m in models.REGISTRY.values():
        ready = str(models.model_dir(m)) if models.is_ready(m) else "no"
        table.add_row(m.name, ", ".join(m.aliases), m.kind, ready, m.description)
    Console(width=200).print(table)


@models_app.command("pull")
def models_pull(names: Annotated[list[str], typer.Argument(help="embedded model names, or 'all'")]) -> None:
    """Prepare embedded models in the cache ($MEMRL_CACHE, default ~/.cache/memrl); idempotent."""
    from memrl.core import models

    wanted = list(models.REGISTRY) if names == ["all"] else names
    for name in wanted:
        with console.status(f"preparing {name}"):
            path = models.pull(name)
        typer.echo(f"{name}: {path}")


# ---- chat / serve ---------------------------------------------------------------------------------------------


@app.command()
def chat(
    message: Annotated[str, typer.Argument(help="the user message")],
    model: Annotated[str, typer.Option(help="embedded name, local path, hub id, or served model name")] = "smollm2",
    endpoint: Annotated[str | None, typer.Option(help="OpenAI-compatible base URL; local model if omitted")] = None,
    api_key: Annotated[
        str | None, typer.Option(envvar="OPENAI_API_KEY", help="key for --endpoint", show_default=False)
    ] = None,
    system: Annotated[str | None, typer.Option(help="system prompt")] = None,
    max_tokens: Annotated[int, typer.Option(min=1, callback=sane_number)] = 128,
    temperature: Annotated[float, typer.Option(min=0.0, callback=sane_number)] = 0.0,
    seed: Annotated[int | None, typer.Option(callback=sane_number)] = None,
    timeout: Annotated[
        float, typer.Option(min=0.001, max=86400, callback=sane_number, help="seconds per request (endpoint only)")
    ] = 60.0,
    retries: Annotated[
        int, typer.Option(min=0, max=100, help="retries on 429/5xx/connection errors (endpoint only)")
    ] = 2,
    as_json: Annotated[bool, typer.Option("--json", help="print text and usage as JSON")] = False,
) -> None:
    """One chat completion through any backend: a smoke test."""
    from pydantic import SecretStr

    from memrl.rollout import SamplingParams, build_backend
    from memrl.rollout.base import Message
    from memrl.rollout.config import HFModelConfig, ModelConfig, OpenAIModelConfig

    cfg: ModelConfig
    if endpoint:
        cfg = OpenAIModelConfig(
            backend="openai",
            model=model,
            endpoint=endpoint,
            api_key=SecretStr(api_key) if api_key else None,
            timeout=timeout,
            max_retries=retries,
        )
    else:
        cfg = HFModelConfig(backend="hf", model=model)
    messages: list[Message] = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": message})
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed)
    with build_backend(cfg) as backend:
        completion = backend.chat(messages, params)
        usage = backend.usage.as_dict()
    if as_json:
        typer.echo(json.dumps({"text": completion.text, "finish_reason": completion.finish_reason, "usage": usage}))
    else:
        typer.echo(completion.text)
        console.print(f"[dim]tokens in {usage['prompt_tokens']}, out {usage['completion_tokens']}[/dim]")


@app.command()
def serve(
    model: Annotated[str, typer.Option(help="embedded name, local path, or hub id")] = "smollm2",
    port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port")] = 8000,
    engine: Annotated[str, typer.Option(help="auto | transformers | vllm (one GPU, no tensor parallelism)")] = "auto",
    host: Annotated[
        str, typer.Option(help="address to listen on: 127.0.0.1 (this machine only), or 0.0.0.0 to open it to others")
    ] = "127.0.0.1",
) -> None:
    """Serve a model over an OpenAI-compatible API until Ctrl-C: a model to try on this machine.

    It binds 127.0.0.1 only unless --host says otherwise (its API has no authentication: anyone who can reach the
    port can use the model) and runs the model on one device.
    On GPUs, serve the recipes' judge, user and teacher with vLLM itself: CUDA_VISIBLE_DEVICES=<the GPUs the recipe's
    placement reserves> vllm serve MODEL --tensor-parallel-size <their count> --gpu-memory-utilization <its fraction>
    (add --host 0.0.0.0 for a cluster), then point the recipe's `endpoint:` at it.
    """
    from memrl.core.errors import ConfigError
    from memrl.rollout.serve import LocalServer, check_host

    if engine not in ("auto", "transformers", "vllm"):
        raise ConfigError(f"--engine must be auto, transformers or vllm, not {engine!r}")
    server = LocalServer(model, port=port, engine=engine, host=check_host(host))  # type: ignore[arg-type]
    with console.status(f"starting {server.engine} serve for {model}"):
        server.start()
    try:  # from the first line on it serves, and Ctrl-C is how it ends
        typer.echo(f"serving {server.name!r} with {server.engine} at {server.url}")
        typer.echo(f"try: memrl chat --endpoint {server.url} --model {server.name} 'hello'")
        assert server.process is not None
        server.process.wait()
        raise MemrlError(f"{server.engine} server exited with code {server.process.returncode}")
    except KeyboardInterrupt:
        console.print("stopping server")
    finally:
        server.stop()


# ---- env ------------------------------------------------------------------------------------------------------


@env_app.command("llamafactory")
def env_llamafactory(
    path: Annotated[Path | None, typer.Option(help="where to create it (default: <cache>/envs/llamafactory)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the steps, change nothing")] = False,
) -> None:
    """Create LLaMA-Factory's own environment (its pins clash with TRL 1.x); prints its llamafactory-cli."""
    from memrl.train.llamafactory.venv import default_env_dir, ensure_env, plan

    env_dir = (path or default_env_dir()).expanduser().resolve()
    if dry_run:
        for step in plan(env_dir):
            typer.echo(" ".join(step.argv))
        return
    with console.status("creating LLaMA-Factory environment") as status:
        cli = ensure_env(env_dir, on_step=lambda step: status.update(step.description))
    typer.echo(str(cli))


def main(argv: Sequence[str] | None = None) -> None:
    """`memrl ARGV...` (default: the process's arguments). Whatever the user's input did wrong is one line on stderr
    and exit 2 (see `errors.user_error`); `--debug` shows the traceback instead."""
    global _debug
    _debug = False
    for stream in (sys.stdout, sys.stderr):  # text no encoding can write (a lone surrogate from an endpoint or a
        if isinstance(stream, io.TextIOWrapper):  # JSON file) is shown as an escape, not a UnicodeEncodeError
            stream.reconfigure(errors="backslashreplace")
    try:
        # Not standalone: typer would print its usage errors as a boxed panel; they take the one-line path too.
        code = app(args=argv, prog_name="memrl", standalone_mode=False)
    except KeyboardInterrupt as exc:  # SIGINT or SIGTERM (memrl.core.interrupts): what it started has ended
        _stopped(exc)
    except typer.Abort:
        print("memrl: aborted", file=sys.stderr)
        raise SystemExit(1) from None
    except Exception as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # the help is printed already (typer's own test, cf. #1278)
            raise SystemExit(2) from None
        line = user_error(exc)
        if line is None or _debug:  # a bug, or --debug: the traceback, with every known secret masked
            print_redacted(type(exc), exc, exc.__traceback__)
            raise SystemExit(1) from None
        # One plain line: rich would wrap it at the terminal width.
        print(f"memrl: error: {line}", file=sys.stderr)
        raise SystemExit(2) from None
    if code == TYPER_INTERRUPTED:  # typer turns a KeyboardInterrupt into this code, silently
        _stopped(None)
    if isinstance(code, int) and code:  # typer.Exit(code) from a command
        raise SystemExit(code)


def _stopped(exc: BaseException | None) -> NoReturn:
    """End a command a signal stopped: the one line, last (a library's progress bar left open would print its last
    state after it, as the process exits: closed first), and 128 + the signal's number."""
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ())):
        with contextlib.suppress(Exception):
            bar.close()
    sys.stdout.flush()
    print(interrupts.line(exc), file=sys.stderr)
    raise SystemExit(interrupts.exit_code(exc))


if __name__ == "__main__":
    main()
