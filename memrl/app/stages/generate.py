"""`generate`: one completion per prompt, streamed to a JSONL file; a rerun skips prompts already answered."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from memrl.app.context import RunContext
from memrl.app.stages.base import StageKind
from memrl.core.errors import ConfigError
from memrl.core.files import parse_json, read_text
from memrl.core.jsonl import ResumableJsonl
from memrl.core.progress import progress
from memrl.core.schema import FileName, StrictModel
from memrl.rollout.base import Message
from memrl.rollout.config import SamplingConfig


class GenerateStage(StrictModel):
    """One completion per prompt, streamed to a JSONL file; a rerun skips prompts already answered."""

    kind: Literal["generate"]
    model: str = Field(description="a key of the recipe's `models`")
    prompts: list[str] = Field(default_factory=list)
    prompts_file: Path | None = Field(default=None, description="JSONL with a 'prompt' field, or plain text lines")
    system: str | None = None
    sampling: SamplingConfig = SamplingConfig()
    output: FileName = "generations.jsonl"

    @model_validator(mode="after")
    def _has_prompts(self) -> GenerateStage:
        if not self.prompts and self.prompts_file is None:
            raise ValueError("give `prompts` or `prompts_file`")
        return self


def _read_prompts(stage: GenerateStage) -> list[str]:
    prompts = list(stage.prompts)
    path = stage.prompts_file
    if path is not None:
        for n, line in enumerate(read_text(path, ConfigError).splitlines(), 1):
            if not line.strip():
                continue
            if path.suffix == ".jsonl":
                record = parse_json(line, f"{path}:{n}", ConfigError, line=False)
                if not isinstance(record, dict) or "prompt" not in record:
                    raise ConfigError(f"{path}:{n}: expected a JSON object with a 'prompt' field")
                prompts.append(str(record["prompt"]))
            else:
                prompts.append(line)
    return prompts


def _prompt_key(system: str | None, prompt: str) -> str:
    return hashlib.sha1(f"{system or ''}\x00{prompt}".encode()).hexdigest()[:16]


def _conversation(system: str | None, prompt: str) -> list[Message]:
    head: list[Message] = [{"role": "system", "content": system}] if system else []
    return [*head, {"role": "user", "content": prompt}]


def run(stage: GenerateStage, ctx: RunContext, name: str) -> None:
    out = ResumableJsonl(ctx.stage_dir(name) / stage.output)
    todo = [p for p in _read_prompts(stage) if _prompt_key(stage.system, p) not in out.done]
    backend = ctx.backend(stage.model)
    params = stage.sampling.params()
    chunk = backend.batch_size
    with progress(ctx.console) as bar:
        task = bar.add_task(f"{name}: generating", total=len(todo))
        for start in range(0, len(todo), chunk):
            batch = todo[start : start + chunk]
            conversations = [_conversation(stage.system, p) for p in batch]
            for prompt, completion in zip(batch, backend.generate(conversations, params), strict=True):
                out.append(
                    {
                        "key": _prompt_key(stage.system, prompt),
                        "prompt": prompt,
                        "completion": completion.text,
                        "finish_reason": completion.finish_reason,
                        "prompt_tokens": completion.prompt_tokens,
                        "completion_tokens": completion.completion_tokens,
                    }
                )
            bar.advance(task, len(batch))
    ctx.console.print(f"{name}: {len(out.done)} generations in {out.path}")


def dry_run(stage: GenerateStage, ctx: RunContext, name: str) -> list[str]:
    return [f"{len(_read_prompts(stage))} prompts to model {stage.model!r}"]


KIND = StageKind(GenerateStage, run, dry_run)
