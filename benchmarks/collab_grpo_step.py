"""Seconds per collab GRPO step and per held-out session, each against TRL's or transformers' own work on the same
batch, so that what memrl adds shows as a ratio measured in one run.

1. **GRPO step.** `collab_grpo` on TRL as the `collaborator-quickstart` recipe runs it (`train_online_grpo`:
   GRPOTrainer with memrl's `rollout_func`, the `Player` playing whole collab episodes with the rule user), sized by
   the flags below. Then TRL's own path on the same batch: a plain GRPOTrainer (same model, same LoRA, same
   GRPOConfig) on single-turn prompts, which are memrl's own episode prompts decoded, each completion forced to the
   mean completion length of memrl's episodes (`min_new_tokens`), with a random reward. Both trainers are the
   recipe's TRL class with timers added (the GRPOTrainer attribute of `trl` is swapped for the timed subclass while
   `train_online_grpo` runs: nothing else changes). A step's seconds run from the previous step's end to its own;
   the first `--warmup` steps are left out. Inside a step: TRL's generation calls, the rollout (memrl: the
   `rollout_func`; TRL: its own generate and decode), generation and scoring (rollout, rewards, old log-probs), and
   the rest (forward, backward, optimizer).

2. **Held-out session.** The `collab_heldout` stage's path: `heldout_config` of the recipe's stages, the base
   policy on the hf backend, greedy, `run_collab` (several users: one served model that batches their turns, Ray
   workers). Against it, bare `model.generate` of the same replies: each round's agent contexts (rebuilt from the
   records) left-padded into one batch, greedy, forced to the round's longest reply, in the served model's dtype.

    OMP_NUM_THREADS=1 python benchmarks/collab_grpo_step.py [--model tiny-qwen2] [--steps 4] [--users 4]
    OMP_NUM_THREADS=1 python benchmarks/collab_grpo_step.py --model smollm2-135m-instruct --steps 2 --warmup 0  # real
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memrl.envs.collab.records import SessionRecord

from cpu_busy import write_result

HERE = Path(__file__).parent
RECIPE = "collaborator-quickstart"


# ---- machine load ---------------------------------------------------------------------------------------------------


def cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of all cores from /proc/stat (Linux; zeros elsewhere)."""
    try:
        fields = [float(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except OSError:
        return 0.0, 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


@contextlib.contextmanager
def machine(into: dict[str, Any]) -> Iterator[None]:
    """Records the 1-minute load average before and after, and the machine's busy cores over the block."""
    busy0, total0 = cpu_times()
    into["load_before"] = round(os.getloadavg()[0], 2)
    yield
    busy1, total1 = cpu_times()
    into["load_after"] = round(os.getloadavg()[0], 2)
    if total1 > total0:
        into["cores_busy"] = round((busy1 - busy0) / (total1 - total0) * (os.cpu_count() or 1), 2)


# ---- timed TRL trainer ----------------------------------------------------------------------------------------------

PARTS = ("generate", "rollout", "generate_and_score")


@dataclass
class StepClock:
    """Seconds and token counts per optimizer step, closed at each step's end."""

    steps: list[dict[str, float]] = field(default_factory=list)
    open: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    last_end: float = 0.0
    prompts: list[list[int]] = field(default_factory=list)  # memrl's episode prompts, in order (for TRL's path)

    def add(self, key: str, value: float) -> None:
        self.open[key] += value

    def start(self) -> None:
        self.last_end = time.perf_counter()

    def end_step(self) -> None:
        now = time.perf_counter()
        self.steps.append({"seconds": now - self.last_end, **self.open})
        self.open, self.last_end = defaultdict(float), now

    def tokens(self, prompt_ids: list[list[int]], completion_ids: list[list[int]], sampled: list[int]) -> None:
        self.add("sequences", len(completion_ids))
        self.add("prompt_tokens", sum(len(p) for p in prompt_ids))
        self.add("completion_tokens", sum(len(c) for c in completion_ids))
        self.add("padded_completion_tokens", len(completion_ids) * max(len(c) for c in completion_ids))
        self.add("sampled_tokens", sum(sampled))


def timed_trainer(base: Any, clock: StepClock) -> Any:
    """`base` (TRL's GRPOTrainer) with timers around its generation, rollout and scoring, and a step clock."""
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            clock.start()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            clock.end_step()

    class Timed(base):
        rollout_func: Any  # set by TRL's __init__ (an annotation only: no class attribute shadows it)

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.add_callback(Clock())
            if self.rollout_func is not None:
                inner = self.rollout_func

                def rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
                    start = time.perf_counter()
                    out = inner(prompts, trainer)
                    clock.add("rollout", time.perf_counter() - start)
                    sampled = [sum(mask) for mask in out["env_mask"]]
                    clock.tokens(out["prompt_ids"], out["completion_ids"], sampled)
                    clock.prompts += out["prompt_ids"]
                    return out

                self.rollout_func = rollout

        def _generate_single_turn(self, prompt_ids: Any, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            ids, logprobs = super()._generate_single_turn(prompt_ids, *args, **kwargs)
            clock.add("generate", time.perf_counter() - start)
            clock.add("generate_calls", 1)
            if self.rollout_func is None:  # TRL's own path: these are the whole completions
                clock.tokens(prompt_ids, ids, [len(c) for c in ids])
            return ids, logprobs

        def _generate(self, prompts: list[Any]) -> Any:
            start = time.perf_counter()
            out = super()._generate(prompts)
            if self.rollout_func is None:
                clock.add("rollout", time.perf_counter() - start)
            return out

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            start = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            clock.add("generate_and_score", time.perf_counter() - start)
            return out

    return Timed


@contextlib.contextmanager
def trl_trainer_swapped(cls: type) -> Iterator[None]:
    """`from trl import GRPOTrainer` returns `cls` inside the block (how `train_online_grpo` gets its trainer)."""
    import trl

    original = trl.GRPOTrainer
    setattr(trl, "GRPOTrainer", cls)  # noqa: B010  (mypy: the attribute is a class)
    try:
        yield
    finally:
        setattr(trl, "GRPOTrainer", original)  # noqa: B010


def summary(clock: StepClock, warmup: int) -> dict[str, Any]:
    timed = clock.steps[warmup:]
    if not timed:
        raise SystemExit(f"no step left after {warmup} warm-up steps: raise --steps")
    keys = sorted({k for s in timed for k in s})
    mean = {k: statistics.fmean(s.get(k, 0.0) for s in timed) for k in keys}
    seconds = mean["seconds"]
    out: dict[str, Any] = {
        "steps_timed": len(timed),
        "seconds_per_step": round(seconds, 3),
        "seconds_per_step_each": [round(s["seconds"], 3) for s in timed],
        "warmup_seconds": [round(s["seconds"], 3) for s in clock.steps[:warmup]],
    }
    for part in PARTS:
        out[f"{part}_seconds"] = round(mean.get(part, 0.0), 3)
    # what no part above covers: the loss's forward and backward, the optimizer, the trainer's bookkeeping
    out["train_seconds"] = round(seconds - mean.get("generate_and_score", 0.0), 3)
    out["rollout_beyond_generate_seconds"] = round(mean.get("rollout", 0.0) - mean.get("generate", 0.0), 3)
    for k in ("generate_calls", "sequences", "prompt_tokens", "completion_tokens", "padded_completion_tokens"):
        out[k] = round(mean.get(k, 0.0), 1)
    out["sampled_tokens"] = round(mean.get("sampled_tokens", 0.0), 1)
    return out


# ---- 1. GRPO step ---------------------------------------------------------------------------------------------------


def recipe_overrides(args: argparse.Namespace, out_dir: Path) -> list[str]:
    return [
        f"output_dir={out_dir}",
        f"models.policy.model={args.model}",
        "logging.backend=none",
        "stages.collab.env.reply=text",
        "stages.collab.env.agent=oracle",
        f"stages.collab.env.max_turns={args.max_turns}",
        f"stages.collab.env.workers={args.workers if args.workers else 'null'}",
        f"stages.collab.max_steps={args.steps}",
        f"stages.collab.batch_size={args.batch_size}",
        f"stages.collab.rollouts={args.rollouts}",
        f"stages.collab.micro_batch_size={args.micro_batch_size}",
        f"stages.collab.max_turn_tokens={args.max_turn_tokens}",
        f"stages.collab.max_episode_tokens={args.max_episode_tokens}",
        "stages.collab.lora.rank=16",
        "stages.collab.lora.alpha=32",
        f"stages.collab.checkpoints.save_steps={args.steps + 1000}",  # no checkpoint inside the timed steps
        "stages.collab.checkpoints.logging_steps=1",
        f"stages.heldout.users={args.users}",
        f"stages.heldout.sessions={args.sessions}",
    ]


def memrl_step(stage: Any, base_model: str, out_dir: Path, seed: int, warmup: int) -> tuple[dict[str, Any], Any]:
    import trl

    from memrl.train.hf_trainer import TrainContext
    from memrl.train.trl.online import train_online_grpo

    clock = StepClock()
    ctx = TrainContext(out_dir=out_dir, stage="collab", seed=seed, report_to="none", run_name="bench-collab")
    with trl_trainer_swapped(timed_trainer(trl.GRPOTrainer, clock)):
        train_online_grpo(stage, base_model, ctx)
    return summary(clock, warmup), clock


def trl_step(stage: Any, base_model: str, out_dir: Path, seed: int, warmup: int, memrl: StepClock) -> dict[str, Any]:
    """TRL's own GRPO on memrl's prompts, single turn, completions forced to memrl's mean completion length."""
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer

    from memrl.core.checkpoints import tokenizer_source
    from memrl.train.hf_trainer import TrainContext
    from memrl.train.trl.grpo import policy_model
    from memrl.train.trl.online import online_args

    timed = memrl.steps[warmup:]
    length = round(sum(s["completion_tokens"] for s in timed) / sum(s["sequences"] for s in timed))
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source(base_model))
    # One prompt per group, in the order memrl played them (each group's rollouts share the prompt).
    prompts = [tokenizer.decode(p) for p in memrl.prompts[:: stage.rollouts]]
    ctx = TrainContext(out_dir=out_dir, stage="trl", seed=seed, report_to="none", run_name="bench-trl")
    config = online_args(stage, ctx) | {
        "max_completion_length": length,
        "generation_kwargs": {"max_new_tokens": length, "min_new_tokens": length},
        "reward_weights": None,
        "shuffle_dataset": False,
    }
    model, lora, _ = policy_model(stage, base_model)
    rng = random.Random(seed)

    def noise(completions: list[Any], **kwargs: Any) -> list[float]:  # rewards that differ within every group
        return [rng.random() for _ in completions]

    clock = StepClock()
    trainer = timed_trainer(trl.GRPOTrainer, clock)(
        model=model,
        reward_funcs=[noise],
        args=trl.GRPOConfig(**config),
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tokenizer,
        peft_config=lora,
    )
    trainer.train()
    return summary(clock, warmup) | {"forced_completion_length": length}


def grpo_rows(memrl: dict[str, Any], trl: dict[str, Any]) -> dict[str, Any]:
    def per_token(r: dict[str, Any]) -> float:
        return round(r["generate_seconds"] / max(r["sampled_tokens"], 1) * 1e3, 2)

    return {
        "step_over_trl": round(memrl["seconds_per_step"] / trl["seconds_per_step"], 3),
        "generate_over_trl": round(memrl["generate_seconds"] / trl["generate_seconds"], 3),
        "train_over_trl": round(memrl["train_seconds"] / trl["train_seconds"], 3),
        "memrl_generate_ms_per_sampled_token": per_token(memrl),
        "trl_generate_ms_per_sampled_token": per_token(trl),
        # memrl's own share of a step: the Player, the episodes (rule user, checkers, grader), the chat template
        "memrl_env_share_of_step": round(memrl["rollout_beyond_generate_seconds"] / memrl["seconds_per_step"], 3),
    }


# ---- 2. held-out session --------------------------------------------------------------------------------------------


def agent_contexts(record: SessionRecord, section: str, notes: str, reply_tokens: int, reply: Any) -> list[Any]:
    """The agent's messages before each of its replies in a finished session, and the reply it gave."""
    from memrl.envs.collab.prompts import agent_messages

    turns = [{"role": t["role"], "content": t["content"]} for t in record.turns]
    return [
        (agent_messages(section, notes, turns[:i], reply_tokens, reply), t["content"])
        for i, t in enumerate(turns)
        if t["role"] == "assistant"
    ]


def bare_generate(model_path: str, rounds: list[list[tuple[Any, str]]], dtype: str, cap: int) -> dict[str, Any]:
    """Each round's contexts in one left-padded batch, greedy, forced to the round's longest reply in tokens (with
    its end of turn; at most `cap`, the reply budget: a random model's text can re-tokenize longer)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model: Any = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
    model.eval()
    batches = []
    for contexts in rounds:
        texts = [tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c, _ in contexts]
        n = min(cap, max(len(tokenizer.encode(r, add_special_tokens=False)) for _, r in contexts) + 1)
        batches.append((tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False), n))
    with torch.inference_mode():  # one warm-up pass: the first generate pays for lazy set-up
        model.generate(**batches[0][0], max_new_tokens=2, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        start = time.perf_counter()
        for enc, n in batches:
            model.generate(
                **enc, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
        seconds = time.perf_counter() - start
    return {
        "seconds": round(seconds, 3),
        "rounds": len(batches),
        "tokens_generated": sum(int(enc["input_ids"].shape[0]) * n for enc, n in batches),
        "dtype": dtype,
    }


def heldout(loaded: Any, out_dir: Path, dtype: str) -> dict[str, Any]:
    from rich.console import Console

    from memrl.core.preferences import as_prompt_text, get_preference
    from memrl.envs.collab.runner import run_collab
    from memrl.rollout.config import HFModelConfig
    from memrl.train.evaluate import servable_model
    from memrl.train.heldout import heldout_config

    stage, training = stages(loaded)
    cfg = heldout_config(stage, training)
    policy = loaded.recipe.models[training.model]
    model = servable_model(policy.model)
    config = policy.model_copy(update={"model": model}) if isinstance(policy, HFModelConfig) else None
    played = cfg.model_copy(update={"model": config or HFModelConfig(backend="hf", model=model)})
    start = time.perf_counter()
    records = run_collab(played, out_dir, Console(quiet=True))
    wall = time.perf_counter() - start
    # the sessions alone, first start to last finish: no server, model or Ray start-up
    sessions = max(r.finished_at for r in records) - min(r.started_at for r in records)
    section = str(cfg.agent)
    by_round: dict[int, list[tuple[Any, str]]] = defaultdict(list)
    for r in records:
        oracle = "\n".join(f"- {as_prompt_text(get_preference(p))}" for p in r.preferences)
        notes = oracle if section == "oracle" else ""  # what the agent kinds a collab_grpo stage trains know
        for k, pair in enumerate(agent_contexts(r, section, notes, training.max_turn_tokens, cfg.reply)):
            by_round[k].append(pair)
    rounds = [by_round[k] for k in sorted(by_round)]
    bare = bare_generate(str(played.model.model), rounds, dtype, cfg.sampling.agent.max_tokens)
    replies = sum(len(v) for v in by_round.values())
    return {
        "sessions": len(records),
        "replies": replies,
        "wall_seconds": round(wall, 2),
        "sessions_seconds": round(sessions, 2),
        "seconds_per_session": round(wall / len(records), 3),
        "sessions_seconds_per_session": round(sessions / len(records), 3),
        "bare_generate": bare,
        "bare_seconds_per_session": round(bare["seconds"] / len(records), 3),
        "wall_over_bare": round(wall / bare["seconds"], 2),
        "sessions_over_bare": round(sessions / bare["seconds"], 2),
    }


def stages(loaded: Any) -> tuple[Any, Any]:
    """The recipe's held-out and training stages, checked: a renamed stage fails here in one line."""
    from memrl.app.stages.heldout import CollabHeldoutStage
    from memrl.train.online.config import OnlineGRPOStage

    heldout, training = loaded.recipe.stages.get("heldout"), loaded.recipe.stages.get("collab")
    if not isinstance(heldout, CollabHeldoutStage) or not isinstance(training, OnlineGRPOStage):
        raise SystemExit(f"{RECIPE}: expected a collab_grpo stage `collab` and a collab_heldout stage `heldout`")
    return heldout, training


# ---- main -----------------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-qwen2", help="the policy (tiny-qwen2; smollm2-135m-instruct: real)")
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps of each trainer, warm-up included")
    parser.add_argument("--warmup", type=int, default=1, help="first steps left out of the timing")
    parser.add_argument("--batch-size", type=int, default=4, help="sessions per step")
    parser.add_argument("--rollouts", type=int, default=4)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--max-turns", type=int, default=2)
    parser.add_argument("--max-turn-tokens", type=int, default=48)
    parser.add_argument("--max-episode-tokens", type=int, default=384)
    parser.add_argument("--workers", type=int, default=0, help="Ray actors of the episodes (0: in-process)")
    parser.add_argument("--users", type=int, default=4, help="held-out users")
    parser.add_argument("--sessions", type=int, default=1, help="held-out sessions per user")
    parser.add_argument("--bare-dtype", default=None, help="dtype of the bare generate; default: the served model's")
    parser.add_argument("--skip", choices=("grpo", "heldout"), default=None)
    parser.add_argument("--run-dir", type=Path, default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

    import torch

    from memrl.app.recipe import load_recipe
    from memrl.rollout.serve import shared_server_args

    scratch = args.run_dir or Path(tempfile.mkdtemp(prefix="bench-collab-"))
    shutil.rmtree(scratch, ignore_errors=True)
    loaded = load_recipe(RECIPE, recipe_overrides(args, scratch))
    training = stages(loaded)[1]
    base_model = str(loaded.recipe.models[training.model].model)  # a name or path, as the stage runner passes it
    result: dict[str, Any] = {
        "model": args.model,
        "recipe": RECIPE,
        "overrides": recipe_overrides(args, Path("<scratch>")),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    try:
        if args.skip != "grpo":
            grpo: dict[str, Any] = {}
            with machine(grpo):
                memrl, clock = memrl_step(training, base_model, scratch / "memrl", loaded.recipe.seed, args.warmup)
                trl = trl_step(training, base_model, scratch / "trl", loaded.recipe.seed, args.warmup, clock)
            result["grpo"] = {"memrl": memrl, "trl": trl, **grpo_rows(memrl, trl), "machine": grpo}
        if args.skip != "heldout":
            served = shared_server_args("transformers")
            dtype = args.bare_dtype or (served[served.index("--dtype") + 1] if "--dtype" in served else "float32")
            machine_h: dict[str, Any] = {}
            with machine(machine_h):
                result["heldout"] = heldout(loaded, scratch / "heldout", dtype) | {"machine": machine_h}
    finally:
        if args.run_dir is None:
            shutil.rmtree(scratch, ignore_errors=True)
    write_result(args.out, "collab_grpo_step", result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
