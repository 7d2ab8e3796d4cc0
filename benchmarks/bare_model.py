"""The bare model doing a quickstart stage's work, on the same machine in the same run: what each stage is measured
against (`quickstart_stages.py`).

- generation (the data and eval stages): every `HFBackend.generate` call the stage made is recorded (its prompts,
  sampling and completion lengths) and replayed with plain `model.generate` on the same batches, each row forced to
  the batch's longest completion (a batch decodes until its longest row ends anyway);
- SFT: the stage's first steps again as plain forward + backward + AdamW on the same LoRA, the same batch size and
  the same rows, tokenized by the chat template and cut at `max_length`;
- GRPO: per step, the policy (the SFT adapter merged into its base, in eval mode: one plain model) samples
  `rollouts` completions of the step's longest length, then one forward + backward over prompt and completions on
  the unmerged adapter.
Training runs at the precision TRL gets from memrl (`hf_trainer.device_args`: bf16 autocast where the CPU has bf16
instructions); the data and eval stages' generation replayed at the dtype memrl decodes in (`core.models.compute_dtype`:
bf16 on a CPU with bf16 instructions, else fp32) and attention (`core.attention`: SDPA for prompts, matmul + softmax
for each new token), so their ratio compares the same arithmetic.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from memrl.core.attention import decode_fast_on_cpu
from memrl.core.models import compute_dtype


@dataclass
class Call:
    model: str
    conversations: list[list[dict[str, str]]]
    temperature: float
    top_p: float
    new_tokens: int  # the longest completion of the batch
    tokens: int  # every completion's tokens: the stage's useful work


@dataclass
class Recorder:
    calls: list[Call] = field(default_factory=list)

    @contextmanager
    def recording(self) -> Iterator[Recorder]:
        """Record every in-process generate call while the block runs."""
        from memrl.rollout.hf_local import HFBackend

        original = HFBackend.generate

        def generate(backend: HFBackend, conversations: Sequence[Any], params: Any = None) -> list[Any]:
            done = original(backend, conversations, params)
            self.calls.append(
                Call(
                    backend.model_path,
                    [[{"role": m["role"], "content": m["content"]} for m in c] for c in conversations],
                    params.temperature if params else 1.0,
                    params.top_p if params else 1.0,
                    max(c.completion_tokens for c in done),
                    sum(c.completion_tokens for c in done),
                )
            )
            return done

        HFBackend.generate = generate  # type: ignore[method-assign]
        try:
            yield self
        finally:
            HFBackend.generate = original  # type: ignore[method-assign]


def _load(path: str, dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    decode_fast_on_cpu(model)  # memrl's own attention split on CPU: the same arithmetic as the stage's
    return model.eval(), tokenizer


def _generate(model: Any, tokenizer: Any, conversations: Sequence[Any], new_tokens: int, temperature: float) -> int:
    prompts = [tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in conversations]
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
    with torch.inference_mode():
        model.generate(
            **enc, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=tokenizer.pad_token_id, **sampling
        )
    return new_tokens * len(conversations)


def replay(calls: Sequence[Call]) -> dict[str, float]:
    """Seconds the bare model takes for the recorded calls (one load per model included), and the tokens it made."""
    start, tokens, loaded = time.perf_counter(), 0, {}
    for call in calls:
        if call.model not in loaded:
            loaded[call.model] = _load(call.model, compute_dtype("cpu"))
        model, tokenizer = loaded[call.model]
        tokens += _generate(model, tokenizer, call.conversations, call.new_tokens, call.temperature)
    rows = sum(len(c.conversations) for c in calls)
    return {
        "seconds": round(time.perf_counter() - start, 1),
        "calls": len(calls),
        "rows": rows,
        "mean_batch": round(rows / max(len(calls), 1), 1),
        "tokens": tokens,
    }


def _lora(model: Any, adapter_dir: Path) -> Any:
    from peft import LoraConfig, get_peft_model

    saved = json.loads((adapter_dir / "adapter_config.json").read_text())
    config = LoraConfig(
        r=saved["r"],
        lora_alpha=saved["lora_alpha"],
        lora_dropout=saved["lora_dropout"],
        target_modules=saved["target_modules"],
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def _autocast() -> Any:
    """The precision memrl gives TRL on this machine."""
    from memrl.train.hf_trainer import device_args

    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(device_args()["bf16"]))


def _train_step(model: Any, optimizer: Any, ids: torch.Tensor, mask: torch.Tensor) -> None:
    with _autocast():
        out = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100))
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def sft_steps(base: str, run_dir: Path, *, steps: int, batch_size: int, max_length: int, lr: float) -> dict[str, float]:
    """Seconds for `steps` plain LoRA training steps on the stage's own rows, and the tokens they trained."""
    model, tokenizer = _load(base)
    tokenizer.padding_side = "right"
    model = _lora(model.train(), run_dir / "sft" / "final")
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    rows = [json.loads(line)["messages"] for line in (run_dir / "data" / "sft" / "train.jsonl").open()]
    texts = [tokenizer.apply_chat_template(r, tokenize=False) for r in rows]
    start, tokens = time.perf_counter(), 0
    for step in range(steps):
        batch = [texts[(step * batch_size + i) % len(texts)] for i in range(batch_size)]
        enc = tokenizer(batch, return_tensors="pt", padding=True, truncation=True, max_length=max_length)
        _train_step(model, optimizer, enc["input_ids"], enc["attention_mask"])
        tokens += int(enc["attention_mask"].sum())
    return {"seconds": round(time.perf_counter() - start, 1), "steps": steps, "tokens": tokens}


def grpo_steps(
    base: str, run_dir: Path, *, steps: int, rollouts: int, max_response: int, temperature: float, lr: float
) -> dict[str, float]:
    """Seconds for `steps` plain GRPO-shaped steps: sample `rollouts` completions of the stage's own longest length
    at that step from the SFT policy (its adapter merged for the sampling), then train on them once."""
    from peft import PeftModel

    history = json.loads((run_dir / "grpo" / "log_history.json").read_text())
    lengths = [int(h.get("completions/max_length", max_response)) for h in history if "completions/max_length" in h]
    model, tokenizer = _load(base)
    model = PeftModel.from_pretrained(model, str(run_dir / "sft" / "final"), is_trainable=True)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    prompts = [json.loads(line)["prompt"] for line in (run_dir / "data" / "rl" / "train.jsonl").open()]
    start, generated, trained = time.perf_counter(), 0, 0
    for step in range(min(steps, len(lengths))):
        prompt = tokenizer.apply_chat_template(prompts[step % len(prompts)], tokenize=False, add_generation_prompt=True)
        enc = tokenizer([prompt] * rollouts, return_tensors="pt", add_special_tokens=False)
        model.eval()
        model.merge_adapter()  # the policy as one plain model, as vLLM would sample it
        with torch.inference_mode():
            out = model.generate(
                **enc,
                max_new_tokens=lengths[step],
                min_new_tokens=lengths[step],
                do_sample=True,
                temperature=temperature,
                pad_token_id=tokenizer.pad_token_id,
            )
        model.unmerge_adapter()
        model.train()
        _train_step(model, optimizer, out.clone(), torch.ones_like(out))
        generated += lengths[step] * rollouts
        trained += int(out.numel())
    return {
        "seconds": round(time.perf_counter() - start, 1),
        "steps": min(steps, len(lengths)),
        "tokens_generated": generated,
        "tokens_trained": trained,
    }
