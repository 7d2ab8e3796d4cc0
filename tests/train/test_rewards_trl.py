"""TRL reward functions: names, weights, shapes, conversational completions, one judge call per batch, None."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from trl.trainer.utils import is_async_callable

from memrl.rewards.config import JudgeConfig, LengthPenaltyConfig, RewardConfig
from memrl.rewards.judge import JudgedScorer
from memrl.rewards.offline_judge import OfflineJudge
from memrl.rewards.registry import reflection_parts
from memrl.rewards.reward import RewardScorer
from memrl.rewards.types import GroundTruth
from memrl.rollout.config import OpenAIModelConfig
from memrl.rollout.serve import free_port
from memrl.train.trl.common import StepLog
from memrl.train.trl.rewards import RewardFunc, reflection_funcs

TRUTH = GroundTruth(("Put that in bullet points.", "End with a one-line TL;DR.")).to_json()
GOOD = json.dumps(
    {"user_preferences_reasoning": "r", "agent_notes": "- Use bullet points.\n- End each reply with a one-line TL;DR."}
)
PROMPT = [{"role": "user", "content": "Reflect on the session."}]


def reward_funcs(cfg: RewardConfig, scorer: RewardScorer | None = None) -> list[RewardFunc]:
    """The reflection reward's TRL functions, judged by `scorer` when given."""
    return reflection_funcs(reflection_parts(cfg, shared={} if scorer is None else {"judge": JudgedScorer(scorer)}))


def reward_weights(cfg: RewardConfig, scorer: RewardScorer) -> list[float]:
    return [part.weight for part in reflection_parts(cfg, shared={"judge": JudgedScorer(scorer)})]


def call_all(
    funcs: list,  # type: ignore[type-arg]
    completions: list,  # type: ignore[type-arg]
    metrics: dict,  # type: ignore[type-arg]
    **columns: Any,
) -> list[list[float | None]]:
    """As TRL 1.16 calls async reward functions: all gathered on one event loop."""
    assert all(is_async_callable(f) for f in funcs)  # TRL then runs them on its loop thread, no thread of ours
    kwargs = {
        "ground_truth": [TRUTH] * len(completions),
        "log_metric": lambda k, v: metrics.setdefault(k, []).append(v),
        **columns,
    }

    async def gather() -> list[list[float | None]]:
        return list(
            await asyncio.gather(
                *(f(prompts=[PROMPT] * len(completions), completions=completions, **kwargs) for f in funcs)
            )
        )

    return asyncio.run(gather())


def test_names_weights_and_one_judge_call_per_batch(model_cache: object) -> None:
    lp = LengthPenaltyConfig(budget=3, per_token=0.01)
    cfg = RewardConfig(coverage_weight=1.0, format_weight=0.5, length_penalty=lp)
    scorer = RewardScorer(cfg, judge=OfflineJudge())
    funcs = reward_funcs(cfg, scorer=scorer)
    assert [f.__name__ for f in funcs] == ["coverage", "format", "length_penalty"]
    assert reward_weights(cfg, scorer) == [1.0, 0.5, 1.0]
    assert [f.__name__ for f in reward_funcs(RewardConfig(), scorer=scorer)] == ["coverage", "format"]
    assert reward_weights(RewardConfig(), scorer) == [1.0, 1.0]

    conversational = [[{"role": "assistant", "content": GOOD}], [{"role": "assistant", "content": "no json"}]]
    metrics: dict[str, list[float]] = {}
    coverage, fmt, penalty = call_all(funcs, conversational, metrics)
    assert coverage == [1.0, 0.0] and fmt == [1.0, 0.0]
    assert penalty[0] is not None and penalty[0] < 0 and penalty[1] == 0.0  # negative: its weight stays positive
    assert scorer.stats()["batches"] == 1  # the three functions shared one judge call
    assert metrics == {"reward/judge_failed": [0.0], "reward/notes_tokens": [9.0]}

    as_text = call_all(funcs, [GOOD, "no json"], metrics)  # plain-string completions: same batch, served from cache
    assert as_text == [coverage, fmt, penalty] and scorer.stats()["batches"] == 1
    call_all(funcs, [GOOD], metrics)
    assert scorer.stats()["batches"] == 2


def test_failed_judge_gives_none_from_every_function(tmp_path: Path) -> None:
    model = OpenAIModelConfig(backend="openai", model="m", endpoint=f"http://127.0.0.1:{free_port()}/v1", max_retries=0)
    cfg = RewardConfig(
        judge=JudgeConfig(kind="llm", model=model, cache_dir=str(tmp_path)), length_penalty=LengthPenaltyConfig()
    )
    metrics: dict[str, list[float]] = {}
    assert call_all(reward_funcs(cfg), [GOOD], metrics) == [[None], [None], [None]]  # TRL: unscorable, advantage 0
    assert metrics["reward/judge_failed"] == [1.0]


def test_each_rollouts_reward_is_logged_under_the_step_it_trains(tmp_path: Path) -> None:
    """What the curve's within-prompt slope reads: per sample its key, weighted reward and parts, under TRL's step
    (global_step + 1 while the step's batch is scored); a resumed run drops the lines of the steps it trains again."""
    cfg = RewardConfig(coverage_weight=1.0, format_weight=0.5)
    log_path = tmp_path / "rewards.jsonl"
    parts = reflection_parts(cfg, shared={"judge": JudgedScorer(RewardScorer(cfg, judge=OfflineJudge()))})
    funcs = reflection_funcs(parts, log=StepLog(log_path))
    for step, keys in ((0, ["a", "a"]), (1, ["b", "b"]), (2, ["a", "a"])):
        state = SimpleNamespace(global_step=step)
        call_all(funcs, [GOOD, "no json"], {}, key=keys, trainer_state=state)
    rows = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert [(r["step"], r["key"], r["reward"]) for r in rows] == [
        (1, "a", 1.5),
        (1, "a", 0.0),
        (2, "b", 1.5),
        (2, "b", 0.0),
        (3, "a", 1.5),
        (3, "a", 0.0),
    ]
    assert rows[0]["parts"]["coverage"] == 1.0 and rows[0]["parts"]["format"] == 1.0
    with log_path.open("a") as f:
        f.write('{"step": 4, "key": "c", "rew')  # the torn line of a killed run
    StepLog(log_path, str(tmp_path / "checkpoint-2"))
    assert [json.loads(line)["step"] for line in log_path.read_text().splitlines()] == [1, 1, 2, 2]
