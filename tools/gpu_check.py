#!/usr/bin/env python3
"""memrl's TRL, judger, export and HF-backend code on one GPU, each phase beside the same work in bare
transformers/peft: seconds, peak GPU memory, throughput and the ratio. Exits 1 when any phase fails.

    pip install --no-index --no-deps .whl/*.whl     # what `make gpu-wheels` downloads (trl, datasets, pydantic, ...)
    python tools/gpu_check.py                       # CUDA, models of SmolLM2-135M's and MiniLM-L6's shapes, bf16
    python tools/gpu_check.py --device cpu          # tiny shapes of the same vocabularies (the test suite runs it)

Nothing is downloaded: the configs and tokenizers are files in tools/gpu_check_assets/, the weights are random (a
seeded init, saved in bf16 as the chat model ships). memrl need not be installed: the script imports it from this
checkout. Phases: SFT with LoRA; GRPO with LoRA and TRL's generation (the offline judge on the MiniLM); one
full-parameter step at lr 1e-6 from the bf16 weights, which must move them (issue 41); the judger's BCE on the
MiniLM; export (merging the SFT adapter); the HF backend's batched generation. Timings include loading the model.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ASSETS = Path(__file__).resolve().parent / "gpu_check_assets"
LAYERS = ("train", "rollout", "rewards", "envs", "data_gen", "recipes")
QUIET = ["disable_tqdm=true"]  # the trainers' progress bars would fill the 12k characters of output a GPU call returns
CHANGED_SHARE = 0.5  # a full-parameter step moves (nearly) every weight; bf16 in place moved 0.4% (issue 41)
# Tiny shapes for CPU: the vocabularies stay (the tokenizers are the real ones), the bodies shrink.
TINY = {
    "chat": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16},
    "encoder": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2},
}  # fmt: skip


@dataclass(frozen=True)
class Sizes:
    """How much work each phase does."""

    steps: int = 4
    batch: int = 8
    prompts: int = 4  # GRPO prompts per step
    rollouts: int = 4
    response: int = 48  # GRPO completion tokens
    pairs: int = 32  # judger pairs per step
    generate: int = 32  # conversations for the HF backend
    new_tokens: int = 64


CPU_SIZES = Sizes(steps=2, batch=4, prompts=2, rollouts=2, response=8, pairs=8, generate=8, new_tokens=8)


@dataclass
class Result:
    seconds: float
    peak_gib: float | None
    amount: float = 0.0  # work done, in `unit`
    unit: str = "tok"

    @property
    def rate(self) -> str:
        return f"{self.amount / self.seconds:,.0f} {self.unit}/s" if self.amount and self.seconds else "-"


@dataclass
class Phase:
    name: str
    memrl: Result | None = None
    bare: Result | None = None
    error: str = ""
    notes: list[str] = field(default_factory=list)


# ---- set-up ---------------------------------------------------------------------------------------------------------


def import_memrl() -> None:
    """memrl from this checkout: installed, or laid out as installed (memrl/ plus the layer folders) in a temp dir."""
    try:
        import memrl.train  # noqa: F401
    except ImportError:
        layout = Path(tempfile.mkdtemp(prefix="memrl-layout-")) / "memrl"
        layout.mkdir()
        atexit.register(shutil.rmtree, layout.parent, ignore_errors=True)  # links only: the checkout stays
        for item in (ROOT / "memrl").iterdir():
            (layout / item.name).symlink_to(item)
        for layer in LAYERS:
            (layout / layer).symlink_to(ROOT / layer)
        sys.path.insert(0, str(layout.parent))
        for name in [m for m in sys.modules if m == "memrl" or m.startswith("memrl.")]:
            del sys.modules[name]


def build_models(work: Path, tiny: bool) -> tuple[Path, Path]:
    """(chat model, encoder) folders: random weights of SmolLM2-135M's and MiniLM-L6's shapes (tiny on CPU)."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

    out = []
    for kind, asset, loader, dtype in (
        ("chat", "smollm2-135m", AutoModelForCausalLM, torch.bfloat16),  # shipped in bf16: transformers loads bf16
        ("encoder", "minilm-l6", AutoModel, torch.float32),
    ):
        config = AutoConfig.from_pretrained(ASSETS / asset)
        for key, value in (TINY[kind] if tiny else {}).items():
            setattr(config, key, value)
        torch.manual_seed(0)
        model = loader.from_config(config, dtype=dtype)
        folder = work / "models" / asset
        model.save_pretrained(folder)
        AutoTokenizer.from_pretrained(ASSETS / asset).save_pretrained(folder)
        out.append(folder)
    return out[0], out[1]


def write_data(work: Path, rows: int) -> Path:
    """SFT messages, GRPO prompts with ground truth, and judger pairs, in the layouts memrl's data stages write."""
    from memrl.data_gen.judger_pairs import JudgerPair
    from memrl.rewards.types import GroundTruth

    rng = random.Random(0)
    prefs = ["Use bullet points.", "End with a one-line summary.", "Answer in one sentence.", "Show every step."]
    data = work / "data"
    for name in ("sft", "rl", "train"):
        (data / name).mkdir(parents=True, exist_ok=True)
    sft, rl, pairs = [], [], []
    for i in range(rows):
        said = rng.sample(prefs, 2)
        prompt = [{"role": "user", "content": f"Session {i}: the user said '{said[0]}' and then '{said[1]}'. "
                   "Write the reflection as JSON."}]  # fmt: skip
        notes = json.dumps({"user_preferences_reasoning": "stated twice", "agent_notes": "- " + "\n- ".join(said)})
        sft.append({"messages": [*prompt, {"role": "assistant", "content": notes}]})
        rl.append({"prompt": prompt, "ground_truth": GroundTruth(tuple(said)).to_json(), "key": f"u{i}/s0"})
        context = [{"speaker": "user", "utterance": f"Book a table for {i % 7 + 2} at eight."}]
        for j, (question, answer) in enumerate((("Which city?", "Paris"), ("Which date?", "Friday"))):
            pairs.append(JudgerPair(
                key=f"{i}/{j}", query_id=f"{i}/1", persona_id=i, session_id=1, service="Restaurants_1",
                intent="ReserveRestaurant", context=tuple(context), intent_query="reserve a table",
                missing_slots=("city",), missing_descriptions=("the city of the restaurant",), memory_session_id=0,
                memory_intent="ReserveRestaurant", memory_service="Restaurants_1", slot=["city", "date"][j],
                question=question, answer=answer, label=int(j == 0), negative=None if j == 0 else "other slot",
            ).to_dict())  # fmt: skip
    for folder, file, items in (("sft", "train.jsonl", sft), ("sft", "eval.jsonl", sft[:2]),
                                ("rl", "train.jsonl", rl), ("train", "pairs.jsonl", pairs)):  # fmt: skip
        (data / folder / file).write_text("".join(json.dumps(r) + "\n" for r in items))
    return data


@contextmanager
def measured(device: str) -> Iterator[Callable[[float, str], Result]]:
    """Times the block; yields `done(amount, unit)`, which returns the Result (seconds, peak GPU memory)."""
    import torch

    cuda = device == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
    start = time.perf_counter()

    def done(amount: float = 0.0, unit: str = "tok") -> Result:
        if cuda:
            torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
        return Result(time.perf_counter() - start, peak, amount, unit)

    yield done


def changed_share(before: Path, after: Path) -> float:
    """The share of weights (elements of the tensors both hold) whose value differs."""
    from safetensors.torch import load_file

    a, b = load_file(before / "model.safetensors"), load_file(after / "model.safetensors")
    names = sorted(set(a) & set(b))
    changed = sum(int((a[n].float() != b[n].float()).sum()) for n in names)
    return changed / sum(a[n].numel() for n in names)


# ---- bare transformers / peft ----------------------------------------------------------------------------------------


class Bare:
    """The same work as each memrl phase, written with transformers, peft and torch only."""

    def __init__(self, device: str, sizes: Sizes) -> None:
        import torch

        self.device, self.sizes = device, sizes
        self.autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda")

    def causal(self, path: Path, dtype: Any = None, lora: bool = False) -> Any:
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(path, **({"dtype": dtype} if dtype else {})).to(self.device)
        if lora:
            model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
        return model

    def sft_batch(self, tokenizer: Any, rows: list[dict[str, Any]]) -> tuple[dict[str, Any], int]:
        """Prompt + completion ids, the loss on the completion only (as TRL's prompt-completion SFT)."""
        import torch

        ids, labels = [], []
        for row in rows:
            prompt = tokenizer.apply_chat_template(row["messages"][:-1], add_generation_prompt=True, tokenize=True)
            whole = tokenizer.apply_chat_template(row["messages"], tokenize=True)
            prompt, whole = _ids(prompt), _ids(whole)
            ids.append(whole)
            labels.append([-100] * len(prompt) + whole[len(prompt) :])
        width = max(map(len, ids))
        pad = tokenizer.pad_token_id
        batch = {
            "input_ids": torch.tensor([r + [pad] * (width - len(r)) for r in ids]),
            "attention_mask": torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in ids]),
            "labels": torch.tensor([r + [-100] * (width - len(r)) for r in labels]),
        }
        return {k: v.to(self.device) for k, v in batch.items()}, sum(map(len, ids))

    def train_sft(
        self, path: Path, rows: list[dict[str, Any]], *, lora: bool, lr: float, steps: int
    ) -> tuple[Any, int]:
        import torch
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
        model = self.causal(path, None if lora else torch.float32, lora)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
        tokens = 0
        for step in range(steps):
            chunk = [rows[(step * self.sizes.batch + i) % len(rows)] for i in range(self.sizes.batch)]
            batch, n = self.sft_batch(tokenizer, chunk)
            with self.autocast:
                loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            tokens += n
        return model, tokens

    def grpo(self, path: Path, rows: list[dict[str, Any]]) -> int:
        """Sampled groups from `generate`, a group-relative advantage (here: completion length, a stand-in for the
        judge), the policy gradient through the LoRA adapters: the trainer's work per step."""
        import torch
        from transformers import AutoTokenizer

        s = self.sizes
        tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
        model = self.causal(path, lora=True)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
        tokens = 0
        for step in range(s.steps):
            prompts = [rows[(step * s.prompts + i) % len(rows)]["prompt"] for i in range(s.prompts)]
            texts = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in prompts]
            enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
            with torch.no_grad(), self.autocast:
                out = model.generate(**enc, do_sample=True, max_new_tokens=s.response, num_return_sequences=s.rollouts,
                                     pad_token_id=tokenizer.pad_token_id)  # fmt: skip
            width = enc["input_ids"].shape[1]
            done = out[:, width:] != tokenizer.pad_token_id
            reward = done.sum(1).float().view(s.prompts, s.rollouts)
            advantage = (reward - reward.mean(1, keepdim=True)).view(-1)
            mask = torch.cat([enc["attention_mask"].repeat_interleave(s.rollouts, 0), done.long()], 1)
            with self.autocast:
                logits = model(input_ids=out, attention_mask=mask).logits[:, width - 1 : -1].float()
            logp = torch.log_softmax(logits, -1).gather(-1, out[:, width:, None]).squeeze(-1)
            loss = -(advantage[:, None] * logp * done).sum() / done.sum().clamp(min=1)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            tokens += int(mask.sum())
        return tokens

    def judger(self, path: Path, pairs: list[dict[str, Any]]) -> int:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        s = self.sizes
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1).to(self.device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
        seen = 0
        for step in range(s.steps):
            chunk = [pairs[(step * s.pairs + i) % len(pairs)] for i in range(s.pairs)]
            dialogue = [" ".join(t["utterance"] for t in r["context"]) for r in chunk]
            note = [f"{r['question']} {r['answer']}" for r in chunk]
            enc = tokenizer(dialogue, note, return_tensors="pt", padding=True, truncation=True, max_length=256)
            labels = torch.tensor([float(r["label"]) for r in chunk], device=self.device)
            with self.autocast:
                logits = model(**enc.to(self.device)).logits[:, 0].float()
            torch.nn.functional.binary_cross_entropy_with_logits(logits, labels).backward()
            optimizer.step()
            optimizer.zero_grad()
            seen += len(chunk)
        return seen

    def generate(self, path: Path, conversations: list[list[dict[str, str]]], dtype: Any) -> int:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(self.device)
        texts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in conversations]
        made = 0
        for start in range(0, len(texts), 16):
            enc = tokenizer(texts[start : start + 16], return_tensors="pt", padding=True, add_special_tokens=False)
            with torch.inference_mode():
                out = model.generate(**enc.to(self.device), do_sample=False, max_new_tokens=self.sizes.new_tokens,
                                     pad_token_id=tokenizer.pad_token_id)  # fmt: skip
            made += int((out[:, enc["input_ids"].shape[1] :] != tokenizer.pad_token_id).sum())
        return made


def _ids(encoded: Any) -> list[int]:
    return list(encoded["input_ids"] if not isinstance(encoded, list) else encoded)


# ---- the phases ------------------------------------------------------------------------------------------------------


def _tokens(log_history: list[dict[str, Any]]) -> float:
    """The tokens TRL counted (its `num_tokens`, cumulative)."""
    return float(max((row.get("num_tokens", 0) for row in log_history), default=0))


def run(device: str, sizes: Sizes, work: Path) -> list[Phase]:
    import torch
    from rich.console import Console

    from memrl.rewards.config import JudgeConfig, RewardConfig
    from memrl.rollout.base import SamplingParams
    from memrl.rollout.hf_local import HFBackend
    from memrl.train.config import GRPOStage, JudgerSelection, JudgerStage, LoggingTarget, LoraConfig, SFTStage
    from memrl.train.export import export_checkpoint
    from memrl.train.hf_trainer import TrainContext
    from memrl.train.judger.trainer import train_judger
    from memrl.train.trl.grpo import train_grpo
    from memrl.train.trl.sft import train_sft

    chat, encoder = build_models(work, tiny=device == "cpu")
    data = write_data(work, rows=max(16, sizes.batch * sizes.steps))
    sft_rows = [json.loads(x) for x in (data / "sft" / "train.jsonl").read_text().splitlines()]
    rl_rows = [json.loads(x) for x in (data / "rl" / "train.jsonl").read_text().splitlines()]
    pairs = [json.loads(x) for x in (data / "train" / "pairs.jsonl").read_text().splitlines()]
    bare = Bare(device, sizes)
    ckpt = LoggingTarget(save_steps=1000, keep=1)
    lora = LoraConfig(rank=8, alpha=16, dropout=0.0)
    phases: list[Phase] = []

    def ctx(name: str) -> TrainContext:
        return TrainContext(work / name, name, 0, "none", f"gpu-check-{name}")

    def phase(name: str, body: Callable[[Phase], None]) -> None:
        current = Phase(name)
        phases.append(current)
        print(f"== {name}", flush=True)
        try:
            body(current)
        except Exception as exc:  # one phase failing must not hide the others' numbers
            traceback.print_exc()
            current.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"

    def sft_lora(p: Phase) -> None:
        stage = SFTStage(kind="sft", model="policy", data="d", lora=lora, lr=1e-4, max_steps=sizes.steps,
                         batch_size=sizes.batch, micro_batch_size=sizes.batch, max_length=512, checkpoints=ckpt,
                         overrides=QUIET)  # fmt: skip
        with measured(device) as done:
            train_sft(stage, str(chat), data, ctx("sft"))
            p.memrl = done(_tokens(json.loads((work / "sft" / "log_history.json").read_text())))
        with measured(device) as done:
            p.bare = done(bare.train_sft(chat, sft_rows, lora=True, lr=1e-4, steps=sizes.steps)[1])

    def grpo_lora(p: Phase) -> None:
        judge = JudgeConfig(embedding_model=str(encoder))  # the offline judge embeds with the random MiniLM
        stage = GRPOStage(kind="grpo", model="policy", data="d", lora=lora, lr=1e-5, max_steps=sizes.steps,
                          batch_size=sizes.prompts, rollouts=sizes.rollouts,
                          micro_batch_size=sizes.prompts * sizes.rollouts, kl_coef=0.0, max_prompt_length=256,
                          max_response_length=sizes.response, reward=RewardConfig(judge=judge), checkpoints=ckpt,
                          overrides=QUIET)  # fmt: skip
        with measured(device) as done:
            train_grpo(stage, str(chat), data, ctx("grpo"), Console(stderr=True))
            p.memrl = done(_tokens(json.loads((work / "grpo" / "log_history.json").read_text())))
        with measured(device) as done:
            p.bare = done(bare.grpo(chat, rl_rows))

    def full_step(p: Phase) -> None:
        stage = SFTStage(kind="sft", model="policy", data="d", lora=None, lr=1e-6, max_steps=1,
                         batch_size=sizes.batch, micro_batch_size=sizes.batch, max_length=512, checkpoints=ckpt,
                         overrides=QUIET)  # fmt: skip
        with measured(device) as done:
            final = train_sft(stage, str(chat), data, ctx("full"))
            p.memrl = done(_tokens(json.loads((work / "full" / "log_history.json").read_text())))
        share = changed_share(chat, final)
        p.notes.append(f"memrl: {share:.1%} of the weights moved")
        with measured(device) as done:
            model, tokens = bare.train_sft(chat, sft_rows, lora=False, lr=1e-6, steps=1)
            p.bare = done(tokens)
        model.save_pretrained(work / "full-bare")
        p.notes.append(f"bare: {changed_share(chat, work / 'full-bare'):.1%} moved")
        if share < CHANGED_SHARE:
            raise AssertionError(f"a full-parameter step at lr 1e-6 moved {share:.1%} of the weights")

    def judger(p: Phase) -> None:
        stage = JudgerStage(kind="judger", model="judger", lr=5e-5, max_steps=sizes.steps, batch_size=sizes.pairs,
                            micro_batch_size=sizes.pairs, max_length=256, alpha_dev_fraction=0, checkpoints=ckpt,
                            selection=JudgerSelection(retriever=None, random_negatives=0), overrides=QUIET)  # fmt: skip
        with measured(device) as done:
            train_judger(stage, str(encoder), data, ctx("judger"))
            p.memrl = done(sizes.steps * sizes.pairs, "pairs")
        with measured(device) as done:
            p.bare = done(bare.judger(encoder, pairs), "pairs")

    def export(p: Phase) -> None:
        from peft import PeftModel
        from transformers import AutoModelForCausalLM, AutoTokenizer

        with measured(device) as done:
            export_checkpoint(work / "sft" / "final", work / "export")
            p.memrl = done()
        with measured(device) as done:
            base = AutoModelForCausalLM.from_pretrained(chat)
            PeftModel.from_pretrained(base, work / "sft" / "final").merge_and_unload().save_pretrained(work / "merged")
            AutoTokenizer.from_pretrained(chat).save_pretrained(work / "merged")
            p.bare = done()

    def generate(p: Phase) -> None:
        model = work / "export" if (work / "export" / "config.json").is_file() else chat
        conversations = [row["prompt"] for row in rl_rows][: sizes.generate]
        conversations += conversations * (sizes.generate // max(1, len(conversations)))
        conversations = conversations[: sizes.generate]
        dtype = "bfloat16" if device == "cuda" else "float32"
        with measured(device) as done:
            backend = HFBackend(str(model), device=device, dtype=dtype, batch_size=16)
            made = backend.generate(conversations, SamplingParams(temperature=0.0, max_tokens=sizes.new_tokens))
            backend.close()
            p.memrl = done(sum(c.completion_tokens for c in made))
        with measured(device) as done:
            p.bare = done(bare.generate(model, conversations, getattr(torch, dtype)))

    for name, body in (("sft_lora", sft_lora), ("grpo_lora", grpo_lora), ("full_step", full_step),
                       ("judger_bce", judger), ("export", export), ("hf_generate", generate)):  # fmt: skip
        phase(name, body)
    return phases


def report(phases: list[Phase], device: str) -> str:
    def cell(r: Result | None) -> tuple[str, str, str]:
        if r is None:
            return "-", "-", "-"
        return f"{r.seconds:.1f}", "-" if r.peak_gib is None else f"{r.peak_gib:.2f}", r.rate

    head = f"{'phase':<12} {'memrl s':>8} {'peak GiB':>9} {'memrl rate':>16} {'bare s':>8} {'peak GiB':>9} "
    head += f"{'bare rate':>16} {'ratio':>6}  status"
    lines = [head]
    for p in phases:
        (ms, mp, mr), (bs, bp, br) = cell(p.memrl), cell(p.bare)
        ratio = f"{p.memrl.seconds / p.bare.seconds:.2f}" if p.memrl and p.bare and p.bare.seconds else "-"
        status = f"FAILED {p.error}" if p.error else "ok"
        notes = f" ({'; '.join(p.notes)})" if p.notes else ""
        lines.append(f"{p.name:<12} {ms:>8} {mp:>9} {mr:>16} {bs:>8} {bp:>9} {br:>16} {ratio:>6}  {status}{notes}")
    lines.append(f"ratio: memrl seconds / bare seconds, on {device}; timings include loading the model")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", type=Path, default=None, help="keep the work folder here (default: a temp dir)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("WANDB_MODE", "disabled")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: --device cuda, but torch sees no CUDA device (use --device cpu)", file=sys.stderr)
        return 2
    import_memrl()
    work = args.out or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ["MEMRL_CACHE"] = str(work / "cache")  # nothing is pulled; a stray lookup stays in the work folder
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU"
    import memrl

    print(f"gpu_check: {name}, torch {torch.__version__}, transformers {transformers.__version__}, work {work}")
    print(f"gpu_check: memrl from {Path(memrl.__file__).parent}")
    sizes = Sizes() if args.device == "cuda" else CPU_SIZES
    started = time.perf_counter()
    phases = run(args.device, sizes, work)
    table = report(phases, name)
    print(table)
    print(f"total {time.perf_counter() - started:.0f} s")
    (work / "gpu_check.txt").write_text(table + "\n")
    failed = [p.name for p in phases if p.error]
    if failed:
        print(f"gpu_check: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
