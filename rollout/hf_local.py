"""In-process transformers model (CPU or GPU) with batched, left-padded generation, and seeded sampling whose draw
for a row depends on the seed and that row's prompt, not on the rest of its batch (`RowSeededSampling`)."""

from __future__ import annotations

import asyncio
import hashlib
import re
import threading
import weakref
from collections import Counter
from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    StoppingCriteria,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)

from memrl.core import interrupts
from memrl.core.asyncs import MicroBatcher, in_own_thread
from memrl.core.attention import decode_fast_on_cpu
from memrl.core.models import compute_dtype
from memrl.rollout.base import ChatBackend, Completion, Conversation, SamplingParams

# How long a request waits for others before its batch decodes. Sessions that share a process resume together
# when a batch ends and each asks again within milliseconds; one decoding pass of a 135M model takes ~0.1 s on CPU.
BATCH_WAIT_S = 0.02

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# `generate` in transformers samples a whole batch from the one global generator, so a row's tokens change with the
# rows that share its batch. In-process batches form by timing (`MicroBatcher` gathers what arrives within 20 ms), so a
# seeded run would not repeat itself. vLLM gives every request its own generator; this does the same in-process: each
# row gets a generator seeded from (seed, prompt, how many identical prompts came before it in the call), and decoding
# takes the argmax of the tempered, top-p filtered scores plus Gumbel noise from that generator. The argmax of scores
# plus standard Gumbel noise is a sample of their softmax (the Gumbel-max trick), so the distribution is the one
# `do_sample=True` draws from.


def row_seeds(seed: int, prompts: Sequence[str]) -> list[int]:
    """One seed per row: identical prompts in a call get different seeds, in their order of arrival."""
    seen: Counter[str] = Counter()
    seeds = []
    for prompt in prompts:
        digest = hashlib.sha256(f"{seed}\0{seen[prompt]}\0{prompt}".encode()).digest()
        seen[prompt] += 1
        seeds.append(int.from_bytes(digest[:8], "little") >> 1)  # torch seeds are at most 64 bits, signed-safe here
    return seeds


class RowSeededSampling(LogitsProcessor):
    """For greedy `generate` (`do_sample=False`): turns each step's scores into one sample per row."""

    def __init__(self, seeds: Sequence[int], temperature: float, top_p: float, device: str | torch.device) -> None:
        warpers: list[LogitsProcessor] = [TemperatureLogitsWarper(temperature)]
        if top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p))
        self.warpers = LogitsProcessorList(warpers)
        self.generators = [torch.Generator(device=device).manual_seed(seed) for seed in seeds]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores = self.warpers(input_ids, scores)
        vocab = scores.shape[-1]
        uniform = torch.stack([torch.rand(vocab, generator=g, device=scores.device) for g in self.generators])
        gumbel = -torch.log(-torch.log(uniform.clamp_(min=torch.finfo(uniform.dtype).tiny)))
        return scores + gumbel  # type: ignore[return-value]  # a float tensor, as transformers' own processors return


def pick_device(device: str) -> str:
    if device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def pick_dtype(dtype: str, device: str) -> torch.dtype:
    """`auto`: bf16 where the hardware computes in it (a GPU, a CPU with bf16 instructions: about 1.7x faster
    decoding on 2 AMX cores, benchmarks/README.md), else fp32."""
    if dtype == "auto":
        return compute_dtype(device)
    return _DTYPES[dtype]


class HFBackend(ChatBackend):
    name = "hf"

    def __init__(self, model_path: str, device: str = "auto", dtype: str = "auto", batch_size: int = 8) -> None:
        super().__init__()
        self.device = pick_device(device)
        self.batch_size = batch_size
        self.tokenizer = AutoTokenizer.from_pretrained(model_path, padding_side="left")
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=pick_dtype(dtype, self.device), device_map=self.device
        )
        self.model.eval()
        decode_fast_on_cpu(self.model)
        self.model_path = model_path
        self._lock = threading.Lock()  # one generate at a time: the model is not re-entrant
        # One batcher per event loop and sampling setting: a batch decodes with one setting.
        self._batchers: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[SamplingParams, MicroBatcher[Conversation, Completion]]
        ] = weakref.WeakKeyDictionary()

    async def achat(self, messages: Conversation, params: SamplingParams | None = None) -> Completion:
        """Concurrent calls on one event loop decode together, up to `batch_size` at a time: the sessions of many
        users in one process share each decoding pass, as a server's continuous batching would share it."""
        params = params or SamplingParams()
        batchers = self._batchers.setdefault(asyncio.get_running_loop(), {})
        if params not in batchers:
            batchers[params] = MicroBatcher(partial(self._agenerate, params), BATCH_WAIT_S, self.batch_size)
        return await batchers[params].submit(messages)

    async def _agenerate(self, params: SamplingParams, batch: list[Conversation]) -> list[Completion]:
        return await in_own_thread(self.generate, batch, params)

    def generate(self, conversations: Sequence[Conversation], params: SamplingParams | None = None) -> list[Completion]:
        params = params or SamplingParams()
        prompts = [self._prompt(c) for c in conversations]
        # With a seed, each row samples from its own generator: its draws do not depend on what else shares its batch
        # (batches form by timing), as a vLLM request with a seed's do. The rows beside it still move its logits at
        # the rounding level, so a local run also keeps the order of its calls (envs.pool.InFlight.next).
        seeds = None if params.seed is None else row_seeds(params.seed, prompts)
        out: list[Completion] = []
        with self._lock:
            for start in range(0, len(prompts), self.batch_size):
                end = start + self.batch_size
                rows = None if seeds is None else seeds[start:end]
                out.extend(self._generate_batch(prompts[start:end], rows, params))
        for completion in out:
            self.usage.record(completion)
        return out

    def _prompt(self, conversation: Conversation) -> str:
        # A lone surrogate (JSON may hold one: "\ud800") is no text a tokenizer takes: the model reads U+FFFD there.
        messages = [{"role": m["role"], "content": _LONE_SURROGATE.sub("\ufffd", m["content"])} for m in conversation]
        return str(self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))

    def _generate_batch(self, prompts: list[str], seeds: list[int] | None, params: SamplingParams) -> list[Completion]:
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        kwargs: dict[str, Any] = {
            "max_new_tokens": params.max_tokens,
            "pad_token_id": self.tokenizer.pad_token_id,
            "stopping_criteria": StoppingCriteriaList([_StopOnSignal()]),
        }
        greedy = {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
        if params.temperature <= 0:
            kwargs.update(greedy)
        elif seeds is None:
            kwargs.update(do_sample=True, temperature=params.temperature, top_p=params.top_p)
        else:
            sampler = RowSeededSampling(seeds, params.temperature, params.top_p, self.device)
            kwargs.update(greedy, logits_processor=LogitsProcessorList([sampler]))
        if params.stop:
            kwargs.update(stop_strings=list(params.stop), tokenizer=self.tokenizer)
        with torch.inference_mode():
            generated = self.model.generate(**enc, **kwargs)  # type: ignore[operator]  # nn.Module typing hides it
        new_tokens = generated[:, enc["input_ids"].shape[1] :]
        eos_ids = _as_set(self.model.generation_config.eos_token_id) | _as_set(self.tokenizer.eos_token_id)
        completions = []
        for row, mask in zip(new_tokens.tolist(), enc["attention_mask"], strict=True):
            n = next((i + 1 for i, t in enumerate(row) if t in eos_ids), len(row))
            text = str(self.tokenizer.decode(row[:n], skip_special_tokens=True))
            text, stopped = _cut_at_stop(text, params.stop)
            hit_eos = n < len(row) or (n > 0 and row[n - 1] in eos_ids)
            completions.append(
                Completion(
                    text=text,
                    prompt_tokens=int(mask.sum()),
                    completion_tokens=n,
                    finish_reason="stop" if stopped or hit_eos else "length",
                )
            )
        return completions

    def close(self) -> None:
        del self.model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


class _StopOnSignal(StoppingCriteria):
    """Ends a generation at its next token once the process is told to stop: a batch decodes in a thread of its
    own, which the signal never interrupts, and the process waits for it before it exits."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        done = torch.full((input_ids.shape[0],), interrupts.stopping(), dtype=torch.bool, device=input_ids.device)
        return done  # type: ignore[return-value]  # a bool tensor: transformers' annotation, not a real type


def _as_set(ids: int | list[int] | None) -> set[int]:
    if ids is None:
        return set()
    return {ids} if isinstance(ids, int) else set(ids)


def _cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """Drop everything from the first stop string on, as OpenAI-compatible servers do."""
    cuts = [i for i in (text.find(s) for s in stop) if i >= 0]
    return (text[: min(cuts)], True) if cuts else (text, False)
