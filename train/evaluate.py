"""Held-out evaluation of a reflector: reward and its parts on the eval split, plus the collab online check."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from statistics import fmean
from typing import Any

from pydantic import Field, PositiveInt, model_validator
from pydantic_core import PydanticCustomError
from rich.console import Console

from memrl.core.checkpoints import is_adapter, resolve_model
from memrl.core.errors import ConfigError
from memrl.core.files import ResumableJsonl, numbered_jsonl
from memrl.core.outcomes import require_data
from memrl.core.progress import progress
from memrl.core.schema import StrictModel
from memrl.envs.collab.agents import AgentKind
from memrl.envs.collab.config import CollabEvalConfig
from memrl.rewards.config import RewardConfig
from memrl.rewards.reward import RewardScorer
from memrl.rewards.types import GroundTruth
from memrl.rollout.base import ChatBackend, SamplingParams
from memrl.rollout.builder import build_backend
from memrl.rollout.config import HFModelConfig, SamplingConfig, VLLMModelConfig
from memrl.rollout.serve import pick_engine
from memrl.train.export import export_checkpoint


class OnlineCheck(StrictModel):
    """Plug each reflector into a collab evaluation and compare it with the first model listed."""

    collab: CollabEvalConfig = Field(default_factory=CollabEvalConfig)


class EvalReflectorConfig(StrictModel):
    """Held-out reward of each model (base, SFT, GRPO, ...) on the eval split; writes the run's report.json."""

    data: str = Field(description="a reflection_data stage of this recipe, or a dataset folder it wrote")
    models: dict[str, str] = Field(
        min_length=1, description="label -> a recipe model key, a stage of this recipe, or a model folder"
    )
    reward: RewardConfig = RewardConfig()
    sampling: SamplingConfig = SamplingConfig(temperature=0.0, max_tokens=256)
    max_samples: PositiveInt | None = None
    draws: PositiveInt | dict[str, PositiveInt] = Field(
        default=1,
        description="notes sampled per held-out session, draw j at sampling seed + j; a session's measures are the "
        "mean of its draws, so its paired interval measures the model rather than one draw's luck. A number: every "
        "model; label -> number: those models, the others drawn once",
    )
    batch_size: PositiveInt = Field(default=8, description="prompts per generation batch (transformers backend)")
    online: OnlineCheck | None = None
    outcome_users: PositiveInt | None = Field(
        default=None,
        description="with `reward.outcome`: held-out users whose next sessions are played (the first row of each); "
        "default: every user of the evaluated rows",
    )

    @model_validator(mode="after")
    def _draws_are_sampled(self) -> EvalReflectorConfig:
        why = greedy_draws(max(map(self.draws_of, self.models)), self.sampling.temperature)
        if isinstance(self.draws, dict) and (unknown := sorted(set(self.draws) - set(self.models))):
            why = f"{', '.join(unknown)} is not a label of `models` ({', '.join(self.models)})"
        if why is not None:  # a model's own error, shown under the stage's key (memrl.core.schema.describe_error)
            raise PydanticCustomError("config_number", "{field}: {problem}", {"field": "draws", "problem": why})
        return self

    def draws_of(self, label: str) -> int:
        """How many notes `label` samples per held-out session."""
        return self.draws if isinstance(self.draws, int) else self.draws.get(label, 1)

    def draws_said(self) -> str:
        """The draws as the report's decoding line gives them ('' for one draw of every model)."""
        counts = {label: self.draws_of(label) for label in self.models}
        if set(counts.values()) == {1}:
            return ""
        if len(set(counts.values())) == 1:
            return f", {counts[next(iter(counts))]} draws a session"
        return ", draws a session: " + ", ".join(f"{label} {n}" for label, n in counts.items())


def greedy_draws(draws: int, temperature: float) -> str | None:
    """Why `draws` notes a session cannot be drawn at `temperature`, or None: greedy draws of one prompt are one."""
    if draws > 1 and temperature == 0:
        return "more than one draw needs a sampling temperature above 0: greedy draws of one prompt are one draw"
    return None


def servable_model(ref: str) -> str:
    """A full model folder for `ref`; an adapter is merged once into `merged/` beside it."""
    path = Path(resolve_model(ref))
    if not (path.is_dir() and is_adapter(path)):
        return str(path)
    merged = path.parent / f"{path.name}-merged"
    if not (merged / "config.json").is_file():
        export_checkpoint(path, merged)
    return str(merged)


def reflector_backend(path: str, batch_size: int) -> ChatBackend:
    """vLLM in-process where vLLM and a GPU are present (7B/8B evaluations), else transformers."""
    if pick_engine("auto") == "vllm":
        return build_backend(VLLMModelConfig(backend="vllm", model=path))
    return build_backend(HFModelConfig(backend="hf", model=path, batch_size=batch_size))


def load_eval_split(data_dir: Path, max_samples: int | None) -> list[dict[str, Any]]:
    path = data_dir / "rl" / "eval.jsonl" if data_dir.is_dir() else data_dir
    require_data(path, "eval data", "a reflection_data folder or its rl/eval.jsonl")
    rows = []
    for n, row in numbered_jsonl(path, ConfigError, torn=False):
        try:
            rows.append({"key": row["key"], "prompt": row["prompt"], "ground_truth": row["ground_truth"]})
        except KeyError:
            raise ConfigError(f"{path}:{n}: expected a JSON object with key, prompt and ground_truth") from None
    if not rows:
        raise ConfigError(f"{path}: no eval rows")
    return rows[:max_samples] if max_samples else rows


def evaluate_reflector(
    model: str,
    data: Path,
    out_dir: Path,
    reward: RewardConfig,
    sampling: SamplingParams,
    console: Console,
    *,
    max_samples: int | None = None,
    batch_size: int = 8,
    draws: int = 1,
) -> dict[str, Any]:
    """Generate `draws` reflections per eval prompt (resumable), score them all, write and return `metrics.json`.

    `scores.jsonl` holds one line per prompt: its first draw's notes and parts, and with more than one draw, every
    draw's under `draws` (what `memrl.train.report.session_measure` averages)."""
    if (why := greedy_draws(draws, sampling.temperature)) is not None:
        raise ConfigError(why)
    rows = load_eval_split(data, max_samples)
    sink = ResumableJsonl(out_dir / "generations.jsonl")
    todo = [(row, n) for n in range(draws) for row in rows if draw_key(row["key"], n) not in sink.done]
    if todo:
        backend = reflector_backend(servable_model(model), batch_size)
        try:
            with progress(console) as bar:
                task = bar.add_task(f"reflecting ({Path(model).name})", total=len(todo))
                for n in range(draws):  # draw n samples at seed + n: a prompt's draws differ, each repeats itself
                    params = sampling if sampling.seed is None else replace(sampling, seed=sampling.seed + n)
                    mine = [row for row, m in todo if m == n]
                    for start in range(0, len(mine), batch_size):
                        chunk = mine[start : start + batch_size]
                        done = backend.generate([r["prompt"] for r in chunk], params)
                        for row, reply in zip(chunk, done, strict=True):
                            record = {"completion": reply.text, "finish_reason": reply.finish_reason}
                            sink.append({"key": draw_key(row["key"], n), **record})
                        bar.advance(task, len(chunk))
        finally:
            backend.close()
    completions = {r["key"]: r["completion"] for r in sink.records()}
    drawn = [(r["key"], n) for r in rows for n in range(draws)]
    truths = {r["key"]: GroundTruth.from_obj(r["ground_truth"]) for r in rows}
    texts = [completions[draw_key(k, n)] for k, n in drawn]
    parts = asyncio.run(RewardScorer(reward).ascore(texts, [truths[k] for k, _ in drawn]))
    each = [{"completion": t, **p.to_dict()} for t, p in zip(texts, parts, strict=True)]
    scored = []
    for i, row in enumerate(rows):
        session = each[i * draws : (i + 1) * draws]
        scored.append({"key": row["key"], **session[0]} | ({"draws": session} if draws > 1 else {}))
    (out_dir / "scores.jsonl").write_text("".join(json.dumps(s) + "\n" for s in scored))
    metrics = summarize(each)
    metrics |= {"n": len(rows), "draws": draws, "model": model}  # means and failure counts are over every draw
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    return metrics


def draw_key(key: str, draw: int) -> str:
    """A generation's key in `generations.jsonl`: the prompt's, with `#n` for draws after the first (a one-draw run
    writes the keys it always wrote, so an older run folder resumes)."""
    return key if draw == 0 else f"{key}#{draw}"


def summarize(scored: list[dict[str, Any]]) -> dict[str, Any]:
    judged = [s for s in scored if not s["judge_failed"]]
    named = [s for s in judged if s.get("n_hallucinated") is not None]

    def mean(key: str, rows: list[dict[str, Any]]) -> float | None:
        values = [float(r[key]) for r in rows if r.get(key) is not None]
        return round(fmean(values), 4) if values else None

    return {
        "n": len(scored),
        "score": mean("score", judged),
        "coverage": mean("coverage", judged),
        "format": mean("format", scored),
        "judge_score": mean("judge_score", judged),
        # Only judges that name the preferences they found (the offline one) can tell hallucinations apart.
        "hallucination_rate": round(fmean(s["n_hallucinated"] > 0 for s in named), 4) if named else None,
        "notes_tokens": mean("notes_tokens", scored),
        "judge_failures": len(scored) - len(judged),
        # Replies with no usable notes (format credit 0): malformed reflector output, counted, never fatal.
        "format_failures": sum(1 for s in scored if s.get("format") == 0.0),
    }


def online_check(models: dict[str, str], cfg: CollabEvalConfig, out_dir: Path, console: Console) -> dict[str, Any]:
    """Run the same collab evaluation with each model as the memory agent's reflector; compare with the first.

    Returns per model the overall task success, user effort and length, and the per-session deltas against the
    first model listed (usually the untrained base).
    """
    from memrl.envs.collab.metrics import write_comparison, write_report
    from memrl.envs.collab.runner import run_collab

    summary: dict[str, Any] = {}
    labels = list(models)
    for label in labels:
        reflector = HFModelConfig(backend="hf", model=servable_model(models[label]))
        run_cfg = cfg.model_copy(update={"agent": AgentKind.MEMORY, "reflector": reflector})
        run_dir = out_dir / label
        console.print(f"online check: collab with the {label} reflector")
        metrics = write_report(run_collab(run_cfg, run_dir, console), run_dir)
        summary[label] = {k: metrics.get(k) for k in ("task_success", "user_effort", "length", "sessions")}
        summary[label]["reflection_parse_failures"] = metrics.get("parse_failures", {}).get("reflection", 0)
    for label in labels[1:]:
        deltas = write_comparison(out_dir / label, out_dir / labels[0], out_dir / f"{label}-vs-{labels[0]}")
        summary[label]["deltas_vs_" + labels[0]] = deltas
    (out_dir / "online.json").write_text(json.dumps(summary, indent=2))
    return summary
