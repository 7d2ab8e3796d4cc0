"""The verl adapter, called through verl 0.9.1's own reward manager (load_reward_manager -> NaiveRewardManager).

verl's reward-loop managers capture the running event loop when built, so each test builds its manager inside the
loop it runs in.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import numpy as np
import pytest
import torch

from memrl.core.errors import ConfigError
from memrl.rewards.config import JudgeConfig, RewardConfig
from memrl.rewards.types import GroundTruth
from memrl.rollout.serve import free_port
from memrl.train.verl.rewards import compute_score, get_parts, reward_config

verl = pytest.importorskip("verl")

TRUTH = GroundTruth(("Hold on. Put that in bullet points.", "Wait. End with a one-line TL;DR."))
FAITHFUL = json.dumps(
    {
        "user_preferences_reasoning": "The user asked for bullets and a TL;DR.",
        "agent_notes": "- Format every answer as a bullet list.\n- Finish each reply with a one-line TL;DR summary.",
    }
)
EVERYTHING = json.dumps(
    {
        "user_preferences_reasoning": "List every style anyone could want.",
        "agent_notes": "- Use bullets.\n- End with a TL;DR.\n- Use headings.\n- Number the steps.\n- Give examples.\n"
        "- Be blunt.\n- Keep it to three sentences.\n- Say how confident you are.",
    }
)
PLAIN = "Use bullet points."  # no JSON contract: format 0, and the agent would store nothing
KEYS = {
    "score",
    "coverage",
    "format",
    "judge_score",
    "length_penalty",
    "notes_tokens",
    "n_hallucinated",
    "judge_failed",
}


def batch(tokenizer: Any, responses: list[str]) -> Any:
    from verl import DataProto

    prompt = tokenizer(["Reflect on the session."] * len(responses), return_tensors="pt")["input_ids"]
    encoded = [tokenizer(r)["input_ids"] for r in responses]
    width = max(len(e) for e in encoded) + 3  # right padding, as rollouts leave it
    pad = tokenizer.pad_token_id
    ids = torch.tensor([e + [pad] * (width - len(e)) for e in encoded])
    mask = torch.tensor([[1] * len(e) + [0] * (width - len(e)) for e in encoded])
    truth = TRUTH.to_json()
    return DataProto.from_dict(
        tensors={
            "prompts": prompt,
            "responses": ids,
            "attention_mask": torch.cat([torch.ones_like(prompt), mask], dim=1),
        },
        non_tensors={
            "data_source": np.array(["memrl/collab_reflection"] * len(responses), dtype=object),
            "reward_model": np.array([{"style": "rule", "ground_truth": truth}] * len(responses), dtype=object),
            "extra_info": np.array([{"index": i} for i in range(len(responses))], dtype=object),
        },
    )


def score_through_verl(tokenizer: Any, name: str, reward_kwargs: dict[str, Any], responses: list[str]) -> Any:
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import load_reward_manager

    config = OmegaConf.create(
        {
            "reward": {
                "custom_reward_function": {
                    "path": "pkg://memrl.train.verl.rewards",
                    "name": name,
                    "reward_kwargs": reward_kwargs,
                },
                "reward_manager": {"source": "register", "name": "naive", "module": {"path": None, "name": None}},
            }
        }
    )
    data = batch(tokenizer, responses)

    async def run() -> tuple[Any, list[dict[str, Any]]]:
        manager = load_reward_manager(config, tokenizer)  # inside the loop: it keeps the running loop
        outputs = await asyncio.gather(*(manager.run_single(data[i : i + 1]) for i in range(len(data))))
        return manager, list(outputs)

    manager, outputs = asyncio.run(run())
    rm_scores = type(manager).assemble_rm_scores(data, [o["reward_score"] for o in outputs])
    return manager, outputs, rm_scores


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen2: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_qwen2)


@pytest.mark.parametrize("name", ["compute_score_async", "compute_score"])
def test_offline_reward_through_verl_reward_manager(tokenizer: Any, name: str) -> None:
    (judged, *_) = get_parts({"judge": "offline"})  # the process-wide parts verl's calls will reuse
    scorer = judged.scorer.scorer  # type: ignore[attr-defined]  # coverage's JudgedScorer holds the RewardScorer
    before = scorer.stats()["batches"]
    responses = [FAITHFUL, EVERYTHING, PLAIN]
    manager, outputs, rm_scores = score_through_verl(tokenizer, name, {"judge": "offline"}, responses)
    judge_calls = scorer.stats()["batches"] - before
    assert judge_calls == 3 if name == "compute_score" else judge_calls < 3  # async calls share judge batches
    assert manager.is_async_reward_score == (name == "compute_score_async")
    faithful, everything, plain = (o["reward_extra_info"] for o in outputs)
    assert all(set(info) == KEYS for info in (faithful, everything, plain))  # verl stacks the same keys per sample
    assert faithful["score"] == 2.0 and faithful["coverage"] == 1.0 and faithful["format"] == 1.0
    assert faithful["score"] > everything["score"] > plain["score"] == 0.0
    assert everything["n_hallucinated"] == 6.0 and faithful["judge_failed"] == 0.0
    assert [o["reward_score"] for o in outputs] == [faithful["score"], everything["score"], 0.0]
    assert rm_scores.shape[0] == 3 and rm_scores.sum(dim=1).tolist() == [o["reward_score"] for o in outputs]


def test_failed_judge_is_a_nan_score_with_a_flag(tokenizer: Any) -> None:
    unreachable = {
        "backend": "openai",
        "model": "m",
        "endpoint": f"http://127.0.0.1:{free_port()}/v1",
        "max_retries": 0,
    }
    kwargs = {"judge": {"kind": "llm", "model": unreachable, "cache": False}}
    _, outputs, rm_scores = score_through_verl(tokenizer, "compute_score_async", kwargs, [FAITHFUL])
    info = outputs[0]["reward_extra_info"]
    # NaN: the memrl_grpo estimator leaves the sample out of its group (tests/train/test_rewards_verl_advantage.py).
    assert math.isnan(outputs[0]["reward_score"]) and info["judge_failed"] == 1.0
    assert torch.isnan(rm_scores.sum(dim=1)).all()
    assert info["coverage"] is None and info["judge_score"] is None and info["format"] == 1.0


def test_reward_kwargs_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    whole = RewardConfig(judge=JudgeConfig(kind="offline"), format_weight=0.5)
    assert reward_config({"reward_config": whole.model_dump_json()}) == whole
    assert reward_config({"judge": "offline", "format_weight": 0.5}) == whole
    monkeypatch.setenv("MEMRL_JUDGE_API_KEY", "sk-test")
    cfg = reward_config({"judge": "llm", "model": "judge", "endpoint": "http://127.0.0.1:1/v1"})
    assert cfg.judge.model is not None and cfg.judge.model.api_key.get_secret_value() == "sk-test"  # type: ignore[union-attr]
    routed = reward_config({"judge": "llm", "model": "rm", "reward_router_address": "10.0.0.1:9000"})
    assert routed.judge.model is not None and routed.judge.model.endpoint == "http://10.0.0.1:9000/v1"  # type: ignore[union-attr]
    capped = reward_config({"judge": "llm", "model": "j", "endpoint": "http://127.0.0.1:1/v1", "max_concurrency": 64})
    assert capped.judge.model is not None and capped.judge.model.max_concurrency == 64  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="unknown keys: failure_score"):
        reward_config({"failure_score": 0.0})
    with pytest.raises(ConfigError, match="unknown keys: judge_kind"):
        reward_config({"judge_kind": "llm"})
    with pytest.raises(ConfigError, match="needs `model`"):
        reward_config({"judge": "llm"})
    with pytest.raises(ConfigError, match="coverage_weight"):
        reward_config({"coverage_weight": "heavy"})


def test_sync_function_directly() -> None:
    result = compute_score("memrl/collab_reflection", FAITHFUL, TRUTH.to_dict(), {"index": 0})
    assert result["score"] == 2.0 and result["judge_failed"] == 0.0
