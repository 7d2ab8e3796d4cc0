"""`memrl export` and `memrl eval reflector`: ship a trained reflector and measure it."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from memrl.app.cli.from_config import sane_number
from memrl.core.errors import ConfigError
from memrl.core.files import check_folder, read_json

console = Console(stderr=True)


def export(
    checkpoint: Annotated[Path, typer.Option(help="a stage folder, its final/ or checkpoint-N/, or a verl checkpoint")],
    out: Annotated[Path, typer.Option(help="where the standalone model goes")],
    lora_alpha: Annotated[
        int | None,
        typer.Option(min=1, callback=sane_number, help="verl LoRA checkpoints: the alpha to write when verl saved 0"),
    ] = None,
) -> None:
    """Merge LoRA into the base and write safetensors, tokenizer and a model card."""
    from memrl.core.checkpoints import final_dir

    check_folder(checkpoint, ConfigError)  # before the model libraries load (seconds): a FIFO, a file, nothing
    from memrl.train.export import export_checkpoint

    source = final_dir(checkpoint)
    with console.status(f"exporting {source}"):
        folder = export_checkpoint(source, out, lora_alpha=lora_alpha)
    typer.echo(str(folder))


def _base_of(model: str) -> str:
    """The untrained model a reflector came from (export metadata or checkpoint info), for the online baseline."""
    from memrl.core.checkpoints import read_info, resolve_model
    from memrl.train.export import EXPORT_FILE

    folder = Path(resolve_model(model))
    if (folder / EXPORT_FILE).is_file():
        base = read_json(folder / EXPORT_FILE, ConfigError).get("base")
        if base:
            return str(base)
    info = read_info(folder)
    if info is not None:
        return info.base
    raise ConfigError(f"cannot tell which model {model} was trained from: pass --baseline for the online check")


def eval_reflector(
    model: Annotated[str, typer.Option(help="an exported folder, a checkpoint, an embedded name or a hub id")],
    data: Annotated[Path, typer.Option(help="a reflection dataset folder (uses rl/eval.jsonl) or such a file")],
    out: Annotated[Path, typer.Option(help="output dir: generations.jsonl, scores.jsonl, metrics.json")],
    judge: Annotated[str, typer.Option(help="offline | llm")] = "offline",
    endpoint: Annotated[str | None, typer.Option(help="OpenAI-compatible URL of the LLM judge")] = None,
    judge_model: Annotated[str | None, typer.Option(help="judge model name (served name with --endpoint)")] = None,
    max_samples: Annotated[int | None, typer.Option(min=1, callback=sane_number)] = None,
    max_tokens: Annotated[int, typer.Option(min=1, callback=sane_number, help="reflection budget")] = 256,
    temperature: Annotated[float, typer.Option(min=0, callback=sane_number, help="0: greedy notes")] = 0.0,
    top_p: Annotated[float, typer.Option(max=1, callback=sane_number, help="nucleus sampling, above 0")] = 1.0,
    seed: Annotated[int | None, typer.Option(callback=sane_number, help="sampling seed (draw j: seed + j)")] = None,
    draws: Annotated[
        int, typer.Option(min=1, callback=sane_number, help="notes per held-out session, scored as their mean")
    ] = 1,
    batch_size: Annotated[int, typer.Option(min=1, callback=sane_number, help="prompts per generation batch")] = 8,
    baseline: Annotated[
        str | None, typer.Option(help="online check: the reflector to compare with (default: the model's base)")
    ] = None,
    online_users: Annotated[
        int, typer.Option(min=0, callback=sane_number, help="online check users (0: skip the online check)")
    ] = 0,
    online_sessions: Annotated[
        int, typer.Option(min=1, callback=sane_number, help="online check sessions per user")
    ] = 3,
    online_max_turns: Annotated[
        int, typer.Option(min=1, callback=sane_number, help="online check agent replies per session")
    ] = 10,
    agent_model: Annotated[str, typer.Option(help="online check: the agent model")] = "smollm2",
) -> None:
    """Held-out reward of a reflector and its parts; optionally the online check in collab against a baseline.

    A rerun with the same --out reuses the reflections already generated.
    """
    from memrl.app.cli.reward import judge_config
    from memrl.envs.collab.config import CollabEvalConfig
    from memrl.rewards.config import RewardConfig
    from memrl.rollout.base import SamplingParams
    from memrl.rollout.config import HFModelConfig
    from memrl.train.evaluate import evaluate_reflector, online_check
    from memrl.train.export import record_evaluation

    if top_p <= 0:
        raise ConfigError(f"--top-p must lie above 0, got {top_p:g}")
    reward = RewardConfig(judge=judge_config(judge, endpoint, judge_model))
    sampling = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=seed)
    # Libraries print at import time (transformers announces wandb's offline mode); stdout carries only the JSON.
    with contextlib.redirect_stdout(sys.stderr):
        metrics = evaluate_reflector(
            model, data, out, reward, sampling, console, max_samples=max_samples, batch_size=batch_size, draws=draws
        )
        record_evaluation(Path(model), data.name, metrics)
        if online_users:
            cfg = CollabEvalConfig(
                users=online_users,
                sessions=online_sessions,
                max_turns=online_max_turns,
                model=HFModelConfig(backend="hf", model=agent_model),
            )
            models = {"baseline": baseline or _base_of(model), "reflector": model}
            metrics["online"] = online_check(models, cfg, out / "online", console)
            (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    typer.echo(json.dumps({k: v for k, v in metrics.items() if k != "online"}))
