"""`generate`: one completion per prompt, streamed to a JSONL file; a rerun skips prompts already answered."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from memrl.core.errors import ConfigError
from memrl.core.files import ResumableJsonl, json_type, numbered_jsonl, read_text
from memrl.core.progress import progress
from memrl.data_gen.config import GenerateConfig
from memrl.rollout.base import ChatBackend, Message


def read_prompts(cfg: GenerateConfig) -> list[str]:
    """The config's prompts, then the file's: one per line of text, or the `prompt` string of each JSONL object."""
    prompts = list(cfg.prompts)
    path = cfg.prompts_file
    if path is None:
        return prompts
    if path.suffix != ".jsonl":
        return prompts + [line for line in read_text(path, ConfigError).splitlines() if line.strip()]
    for n, record in numbered_jsonl(path, ConfigError, torn=False):
        prompt = record.get("prompt")
        if not isinstance(prompt, str):  # null, a list, a number: no prompt, whatever str() would make of it
            what = "no 'prompt' field" if "prompt" not in record else f"a 'prompt' that is {json_type(prompt)}"
            raise ConfigError(f"{path}:{n}: expected a JSON object with a 'prompt' string, got {what}")
        prompts.append(prompt)
    return prompts


def _prompt_key(system: str | None, prompt: str) -> str:
    # surrogatepass: a prompt read from JSON may hold a lone surrogate, which strict UTF-8 cannot encode
    return hashlib.sha1(f"{system or ''}\x00{prompt}".encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _conversation(system: str | None, prompt: str) -> list[Message]:
    head: list[Message] = [{"role": "system", "content": system}] if system else []
    return [*head, {"role": "user", "content": prompt}]


def generate(
    cfg: GenerateConfig, backends: Callable[[str], ChatBackend], folder: Path, console: Console, what: str
) -> ResumableJsonl:
    """Answer the prompts not yet in `folder / cfg.output` with the backend `backends` gives for `cfg.model` (asked
    once the prompts are read); returns that file, every answer in it."""
    out = ResumableJsonl(folder / cfg.output)
    todo = [p for p in read_prompts(cfg) if _prompt_key(cfg.system, p) not in out.done]
    backend = backends(cfg.model)
    params = cfg.sampling.params()
    chunk = backend.batch_size
    with progress(console) as bar:
        task = bar.add_task(f"{what}: generating", total=len(todo))
        for start in range(0, len(todo), chunk):
            batch = todo[start : start + chunk]
            conversations = [_conversation(cfg.system, p) for p in batch]
            for prompt, completion in zip(batch, backend.generate(conversations, params), strict=True):
                out.append(
                    {
                        "key": _prompt_key(cfg.system, prompt),
                        "prompt": prompt,
                        "completion": completion.text,
                        "finish_reason": completion.finish_reason,
                        "prompt_tokens": completion.prompt_tokens,
                        "completion_tokens": completion.completion_tokens,
                    }
                )
            bar.advance(task, len(batch))
    return out
