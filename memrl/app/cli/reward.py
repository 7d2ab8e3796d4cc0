"""`memrl reward score`: the reflection reward of one reflection, as one JSON object; `memrl reward list`: every
reward memrl trains with (memrl.rewards.registry)."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from memrl.app.cli.from_config import sane_number
from memrl.core.errors import BackendError, ConfigError
from memrl.core.files import read_text

reward_app = typer.Typer(no_args_is_help=True)  # its help: main.LAZY_GROUPS


@reward_app.callback()
def _group() -> None:
    """The rewards: list them, score a reflection."""  # a callback keeps each command a subcommand on its own


def _read(path: Path, what: str) -> str:
    if not path.exists():
        raise ConfigError(f"{what} file not found: {path}")
    return read_text(path, ConfigError)  # a binary or Latin-1 file: one line naming it


def judge_config(judge: str, endpoint: str | None, model: str | None, cache_dir: Path | None = None) -> Any:
    """The JudgeConfig the `--judge/--endpoint/--model` flags describe (shared by every command that scores)."""
    from memrl.rewards.config import JudgeConfig
    from memrl.rollout.config import HFModelConfig, OpenAIModelConfig

    cache = str(cache_dir) if cache_dir else None
    if judge == "offline":
        return JudgeConfig(kind="offline", cache_dir=cache)
    if judge != "llm":
        raise ConfigError(f"--judge must be offline or llm, not {judge!r}")
    if endpoint:
        if not model:
            raise ConfigError("--judge llm with --endpoint needs --model (the name the server serves)")
        spec: Any = OpenAIModelConfig(backend="openai", model=model, endpoint=endpoint)
    else:
        spec = HFModelConfig(backend="hf", model=model or "smollm2")
    return JudgeConfig(kind="llm", model=spec, cache_dir=cache)


def probe_endpoint(endpoint: str, model: str) -> None:
    """Fail now, in one line, when the judge's endpoint does not answer (not after every retry, as a null score)."""
    from memrl.rollout.openai_http import OpenAIBackend

    backend = OpenAIBackend(model=model, base_url=endpoint, timeout=10.0, max_retries=0)
    try:
        backend.list_models()
    finally:
        backend.close()


@reward_app.command("list")
def list_rewards(as_json: Annotated[bool, typer.Option("--json", help="one JSON object per line")] = False) -> None:
    """Every reward by name: the parts trainers log, what scoring a sample needs, where it is built."""
    from rich.console import Console
    from rich.table import Table

    import memrl.envs.registry
    import memrl.train.rewards  # noqa: F401  (registers the rewards that play an environment)
    from memrl.rewards.registry import listed

    if as_json:
        for entry in listed():
            typer.echo(json.dumps(entry.row()))
        return
    table = Table("name", "parts", "needs", "what")
    for entry in listed():
        table.add_row(entry.name, ", ".join(entry.parts), entry.needs, entry.summary)
    Console(width=200).print(table)


@reward_app.command("score")
def score(
    reflection_file: Annotated[
        Path, typer.Option("--reflection-file", help="the raw reflection: the JSON the model wrote, or plain notes")
    ],
    enforcements_file: Annotated[
        Path, typer.Option("--enforcements-file", help="the user's enforcing utterances, one per line")
    ],
    gold_file: Annotated[
        Path | None, typer.Option("--gold-file", help="the gold reflection (JSON or plain notes)")
    ] = None,
    judge: Annotated[str, typer.Option(help="offline | llm")] = "offline",
    endpoint: Annotated[str | None, typer.Option(help="OpenAI-compatible base URL of the LLM judge")] = None,
    model: Annotated[str | None, typer.Option(help="LLM judge model (served name with --endpoint)")] = None,
    expected: Annotated[
        str | None, typer.Option(help="comma-separated taxonomy ids the notes should hold (default: derived)")
    ] = None,
    coverage_weight: Annotated[float, typer.Option(callback=sane_number)] = 1.0,
    format_weight: Annotated[float, typer.Option(callback=sane_number)] = 1.0,
    cache_dir: Annotated[
        Path | None, typer.Option(help="LLM judge verdict cache (default <memrl cache>/judge)")
    ] = None,
) -> None:
    """Score one reflection: prints {"score", "coverage", "format", ..., "reasoning"} as one JSON object.

    A reply without the JSON contract is graded as plain notes (its format credit is 0).
    """
    from memrl.rewards.format import extract_notes
    from memrl.rewards.reward import RewardConfig, RewardScorer
    from memrl.rewards.types import GroundTruth

    reflection = _read(reflection_file, "reflection")
    enforcements = tuple(line.strip() for line in _read(enforcements_file, "enforcements").splitlines() if line.strip())
    gold = ""
    if gold_file is not None:
        gold_text = _read(gold_file, "gold")
        gold = extract_notes(gold_text) or gold_text.strip()
    ids = [pid.strip() for pid in expected.split(",") if pid.strip()] if expected else []
    truth = GroundTruth.from_obj({"enforcements": list(enforcements), "gold_notes": gold, "expected": ids})
    cfg = RewardConfig(
        judge=judge_config(judge, endpoint, model, cache_dir),
        coverage_weight=coverage_weight,
        format_weight=format_weight,
        plain_text_notes=True,
    )
    if endpoint and model:
        probe_endpoint(endpoint, model)
    # Libraries loaded on the way (sentence-transformers, wandb hooks) may print; stdout carries only the JSON.
    with contextlib.redirect_stdout(sys.stderr):
        scorer = RewardScorer(cfg)
        parts = scorer.score([reflection], [truth])[0]
    if parts.judge_failed:  # a score command that scored nothing has failed, whatever the judge's reason
        raise BackendError(f"judge {scorer.judge.name} gave no verdict after its retries (see the warnings above)")
    typer.echo(json.dumps({**parts.to_dict(), "judge": scorer.judge.name}, ensure_ascii=False))
