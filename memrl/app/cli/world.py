"""`memrl world serve WORLD`: a world as an OpenEnv server (memrl.integrations.openenv).

One command per world with a served half in the world table (memrl.envs.registry, `served`), in table order and
described by its `help`. It takes one flag per field of the world's config, named and described by the field, as the
action commands do (`from_config`), plus where to listen. Not under `memrl env`, which manages the separate
environments of tools.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from memrl.app.cli.from_config import (
    MODEL_HELP,
    _choices,
    _is_role,
    _option,
    _shown_default,
    _strip,
    sane_number,
)
from memrl.core.errors import ConfigError
from memrl.core.schema import StrictModel, describe_error
from memrl.envs.registry import served_worlds
from memrl.rollout.config import model_from_spec

world_app = typer.Typer(help="memrl's worlds for other trainers: OpenEnv servers.", no_args_is_help=True)
serve_app = typer.Typer(
    help="Serve a world over OpenEnv (reset/step over HTTP and WebSocket) on 127.0.0.1 unless --host is given.",
    no_args_is_help=True,
)
world_app.add_typer(serve_app, name="serve")


def _serve_command(name: str, model: type[StrictModel], help_text: str) -> Callable[..., None]:
    params = [
        inspect.Parameter(
            "port",
            inspect.Parameter.KEYWORD_ONLY,
            default=8000,
            annotation=Annotated[int, typer.Option("--port", help="port to listen on", callback=sane_number)],
        ),
        inspect.Parameter(
            "host",
            inspect.Parameter.KEYWORD_ONLY,
            default="127.0.0.1",
            annotation=Annotated[str, typer.Option("--host", help="address to listen on")],
        ),
        inspect.Parameter(
            "max_clients",
            inspect.Parameter.KEYWORD_ONLY,
            default=8,
            annotation=Annotated[
                int, typer.Option("--max-clients", help="clients playing at once", callback=sane_number)
            ],
        ),
    ]
    fields: list[str] = []
    roles: set[str] = set()
    for field, info in model.model_fields.items():
        plain = _strip(info.annotation)
        help_ = info.description or ""
        if _is_role(plain):
            roles.add(field)
            plain, help_ = str, f"{help_ or field}: {MODEL_HELP}"
        elif _choices(plain):
            plain = str  # pydantic says what is wrong in one line
        fields.append(field)
        params.append(_option(field, plain, help_, required=info.is_required(), shown=_shown_default(info)))

    def command(**values: Any) -> None:
        from memrl.integrations.openenv import serve
        from memrl.integrations.worlds import build_world
        from memrl.rollout.serve import check_host

        host = check_host(values["host"])
        if not 0 < values["port"] < 65536:
            raise ConfigError(f"--port {values['port']}: give a port from 1 to 65535")
        if values["max_clients"] < 1:
            raise ConfigError("--max-clients: give at least 1")
        spec = {f: values[f] for f in fields if values[f] is not None}
        spec |= {f: model_from_spec(spec[f]) for f in roles & spec.keys()}
        try:
            cfg = model.model_validate(spec)
        except ValidationError as exc:
            raise ConfigError(describe_error(exc, model)) from None
        world = build_world(name, cfg)

        def announce(url: str) -> None:
            typer.echo(f"serving memrl world {name} (OpenEnv) at {url}")
            sys.stdout.flush()

        serve(world, host, values["port"], values["max_clients"], announce)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = help_text
    return command


@world_app.command("play")
def play(
    world: Annotated[str, typer.Argument(help=f"the world served: {' | '.join(served_worlds())}")],
    env: Annotated[str, typer.Option("--env", help="the server's URL (memrl world serve)")] = "http://127.0.0.1:8001",
    model: Annotated[str, typer.Option("--model", help=f"the agent: {MODEL_HELP}")] = "smollm2",
    seed: Annotated[int | None, typer.Option("--seed", help="the episode's seed", callback=sane_number)] = None,
    reflector: Annotated[
        str | None, typer.Option("--reflector", help="several collab sessions: policy | oracle | empty")
    ] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="tokens per reply", callback=sane_number)] = 256,
    temperature: Annotated[float, typer.Option("--temperature", help="0: greedy", callback=sane_number)] = 0.0,
) -> None:
    """Play one episode of a served world with a model as the agent (OpenEnv's own client); prints the turns, then
    the reward, its parts and the record as JSON."""
    import asyncio
    import json

    from memrl.integrations.openenv import play_remote
    from memrl.integrations.worlds import world_config
    from memrl.rollout.base import SamplingParams
    from memrl.rollout.builder import build_backend

    world_config(world)  # an unknown world fails in one line
    if max_tokens < 1:
        raise ConfigError("--max-tokens: give at least 1")
    backend = build_backend(model_from_spec(model))
    options = {} if reflector is None else {"reflector": reflector}
    sampling = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed)
    try:
        result = asyncio.run(
            play_remote(env, world, backend, sampling, seed, lambda line: print(line, file=sys.stderr), **options)
        )
    except (ConnectionError, OSError) as exc:
        raise ConfigError(f"--env {env}: cannot play there ({exc})") from None
    except RuntimeError as exc:  # the server's one line
        raise ConfigError(str(exc)) from None
    finally:
        backend.close()
    typer.echo(json.dumps(result))


def _install() -> None:
    for name, served in served_worlds().items():
        serve_app.command(name)(_serve_command(name, served.config, served.help))


_install()
