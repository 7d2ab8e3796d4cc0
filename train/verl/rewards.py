"""verl custom reward functions: the reflection reward, with the next-session outcome mixed in when it is configured.

    reward.custom_reward_function.path=pkg://memrl.train.verl.rewards
    reward.custom_reward_function.name=compute_score_async        # or compute_score (sync)
    +reward.custom_reward_function.reward_kwargs.judge=offline    # offline (default) | llm

verl merges `reward_kwargs` into every call. Either `reward_config` (a RewardConfig as a mapping or a JSON string:
what `memrl` launchers pass) or shorthand keys: `judge` (a kind, or a full JudgeConfig mapping), `model`,
`endpoint`, `api_key`, `cache_dir`, `retries`, `coverage_weight`, `format_weight`, `length_penalty`
(a LengthPenaltyConfig mapping), `outcome` (a NextSessionRewardConfig mapping), `max_concurrency` (judge requests in
flight, with `endpoint`). An OpenAI-compatible judge without a key reads MEMRL_JUDGE_API_KEY. With `judge=llm` and
no endpoint, a reward model that verl's reward loop serves is used through its router (`reward_router_address`),
under `model` or the reward model's path. The reflection reward's parts (memrl.rewards.registry) are built once per
process and configuration, and reused; this adapter holds no code of its own per part.

A sample whose judge failed after its retries has no reward: its `score` is NaN (a float, as verl requires) with
`judge_failed: 1.0` and `coverage` / `judge_score` None. The `memrl_grpo` advantage estimator
(`memrl.train.verl.advantage`) leaves NaN-scored samples out of their group and gives them advantage 0, as TRL
does with a None reward; verl's plain `grpo` estimator would spread the NaN over the whole group, so launchers set
`algorithm.adv_estimator=memrl_grpo`. `judge_failed` reaches verl's validation metrics (`val-aux/.../judge_failed`);
during training the estimator logs each step's count, and verl's `critic/score/mean` reads NaN on such a step.

`score` is the weighted sum of the parts; the dict holds every part's value and what its scorer logs beside it (the
judge's `judge_score`, `notes_tokens`, ...; with an `outcome` block, its `data` the reflection_data folder:
`outcome_with_notes`, `outcome_without_notes`, `outcome_failed`). A sample whose next session failed scores NaN too.
The row's user comes from `extra_info.key`; concurrent calls of the async function are scored as one batch per part
scorer (one judge call, one lock-step batch of sessions).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import SecretStr, ValidationError

import memrl.train.rewards  # noqa: F401  (registers the next-session outcome)
from memrl.core.asyncs import MicroBatcher, run_sync
from memrl.core.errors import ConfigError
from memrl.core.process_cache import ProcessCache
from memrl.rewards.config import JudgeConfig, RewardConfig
from memrl.rewards.parts import PartScorer, RewardPart, Sample, Scored, score_parts, scorers, total
from memrl.rewards.registry import reflection_parts
from memrl.rewards.types import GroundTruth
from memrl.rollout.config import OpenAIModelConfig

_PARTS: ProcessCache[str, list[RewardPart]] = ProcessCache()
# One batcher per (event loop, part scorer), by the scorer's id: the parts are built once per process and kept.
_BATCHERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, MicroBatcher[Sample, Scored]]] = (
    weakref.WeakKeyDictionary()
)
_LOCK = threading.Lock()
_REWARD_KEYS = tuple(key for key in RewardConfig.model_fields if key != "judge")  # the shorthand's RewardConfig keys
_JUDGE_KEYS = ("cache_dir", "retries")
_VERL_KEYS = ("reward_router_address", "reward_model_tokenizer")  # never part of the config
_SHORTHAND_KEYS = ("judge", "model", "endpoint", "api_key", "max_concurrency", *_VERL_KEYS)
JUDGE_KEY_ENV = "MEMRL_JUDGE_API_KEY"
# The outcome reward's models get their keys the same way, one variable each.
OUTCOME_KEY_ENVS = {"agent": "MEMRL_OUTCOME_AGENT_API_KEY", "judge": "MEMRL_OUTCOME_JUDGE_API_KEY"}
# The advantage estimator that leaves NaN-scored (judge failed) samples out, and the module that registers it.
ADV_ESTIMATOR = "memrl_grpo"
ADV_MODULE = "memrl.train.verl.advantage"
REWARD_MODULE = "memrl.train.verl.rewards"  # what verl loads the reward functions from, outcome or not


def reward_path() -> str:
    """Where verl loads compute_score from: always the importable module (`pkg://`), since verl's reward workers sit
    on every node of the run, where a file path of this node may not exist."""
    return f"pkg://{REWARD_MODULE}"


def _plain(value: Any) -> Any:
    """OmegaConf containers (what Hydra hands verl) to plain dicts and lists."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [_plain(v) for v in value]
    return value


def _judge_model(kind: str, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    if kind != "llm":
        return None
    endpoint, model = kwargs.get("endpoint"), kwargs.get("model")
    router = kwargs.get("reward_router_address")
    if not endpoint and router:  # the reward model verl serves behind its router speaks the OpenAI API
        endpoint = f"http://{router}/v1"
        tokenizer = kwargs.get("reward_model_tokenizer")
        model = model or getattr(tokenizer, "name_or_path", None)
    if not model:
        raise ConfigError("reward_kwargs: judge=llm needs `model` (and `endpoint`, or a reward model served by verl)")
    if endpoint:
        spec = {"backend": "openai", "model": model, "endpoint": endpoint}
        optional = {k: kwargs[k] for k in ("api_key", "max_concurrency") if kwargs.get(k)}
        return spec | optional
    return {"backend": "hf", "model": model}


def _from_shorthand(kw: dict[str, Any]) -> RewardConfig:
    judge = kw.get("judge", "offline")
    if isinstance(judge, dict):
        judge_cfg = JudgeConfig.model_validate(judge)
    else:
        extra = {k: kw[k] for k in _JUDGE_KEYS if k in kw}
        judge_cfg = JudgeConfig.model_validate({"kind": judge, "model": _judge_model(str(judge), kw), **extra})
    return RewardConfig.model_validate({"judge": judge_cfg, **{k: kw[k] for k in _REWARD_KEYS if k in kw}})


def _keyed(model: Any, env: str) -> Any:
    """`model` with the API key from the variable `env`, where it is an endpoint without a key of its own."""
    key = os.environ.get(env)
    if not isinstance(model, OpenAIModelConfig) or model.api_key is not None or not key:
        return model
    return model.model_copy(update={"api_key": SecretStr(key)})


def _with_env_key(cfg: RewardConfig) -> RewardConfig:
    """Launchers keep API keys off the command line: the judge's comes in MEMRL_JUDGE_API_KEY, the outcome reward's
    agent and judge in OUTCOME_KEY_ENVS."""
    judge = cfg.judge.model_copy(update={"model": _keyed(cfg.judge.model, JUDGE_KEY_ENV)})
    cfg = cfg.model_copy(update={"judge": judge})
    if cfg.outcome is not None:
        keyed = {role: _keyed(getattr(cfg.outcome, role), env) for role, env in OUTCOME_KEY_ENVS.items()}
        cfg = cfg.model_copy(update={"outcome": cfg.outcome.model_copy(update=keyed)})
    return cfg


def reward_config(kwargs: Mapping[str, Any]) -> RewardConfig:
    """The RewardConfig that verl's `reward_kwargs` describe (see the module docstring for the keys)."""
    kw = _plain(dict(kwargs))
    whole = kw.get("reward_config")
    allowed = {"reward_config", *_VERL_KEYS} if whole is not None else {*_REWARD_KEYS, *_JUDGE_KEYS, *_SHORTHAND_KEYS}
    unknown = set(kw) - allowed
    if unknown:
        raise ConfigError(f"reward_kwargs: unknown keys: {', '.join(sorted(unknown))}")
    try:
        if whole is None:
            return _with_env_key(_from_shorthand(kw))
        data = json.loads(whole) if isinstance(whole, str) else whole
        return _with_env_key(RewardConfig.model_validate(data))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"reward_kwargs: reward_config is not valid JSON: {exc.msg}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "reward_kwargs"
        raise ConfigError(f"reward_kwargs: {where}: {first['msg']}") from None


def get_parts(kwargs: Mapping[str, Any]) -> list[RewardPart]:
    """The process-wide reflection reward parts for this configuration (built on first use)."""
    cfg = reward_config(kwargs)
    return _PARTS.get(json.dumps(cfg.model_dump(mode="json"), sort_keys=True), lambda: reflection_parts(cfg))


def to_verl(parts: Sequence[RewardPart], scored: Sequence[Scored]) -> dict[str, float | None]:
    """The dict verl logs for one sample from its scorers' results: `score` is always a float (NaN: no reward), then
    every part's value and what the scorers log beside it (the same keys for every sample: verl stacks them)."""
    values: dict[str, float | None] = {}
    logged: dict[str, float | None] = {}
    for one in scored:
        values |= one.values
        logged |= one.logged
    score = total(parts, values)
    return {"score": math.nan if score is None else score, **values, **logged}


def _truth(ground_truth: Any) -> GroundTruth:
    return GroundTruth.from_obj(ground_truth if isinstance(ground_truth, str) else _plain(ground_truth))


def _batcher(scorer: PartScorer) -> MicroBatcher[Sample, Scored]:
    """This event loop's batcher of `scorer`: the samples of concurrent calls are scored as one batch."""
    loop = asyncio.get_running_loop()
    with _LOCK:
        held = _BATCHERS.setdefault(loop, {})
        if id(scorer) not in held:
            held[id(scorer)] = MicroBatcher(scorer.ascore, wait_s=0.02)
        return held[id(scorer)]


def _sample(solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None) -> Sample:
    key = (extra_info or {}).get("key")
    return Sample(solution_str, _truth(ground_truth), None if key is None else str(key))


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None, **kwargs: Any
) -> dict[str, float | None]:
    """Sync reward function (verl runs it in a thread pool, one sample per call)."""
    parts = get_parts(kwargs)
    sample = _sample(solution_str, ground_truth, extra_info)
    batch = run_sync(score_parts(parts, [sample]))
    return {"score": math.nan if batch.totals[0] is None else batch.totals[0], **batch.values[0], **batch.logged[0]}


async def compute_score_async(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None, **kwargs: Any
) -> dict[str, float | None]:
    """Async reward function for verl's reward loop: concurrent calls are batched, one batch per part scorer (one
    judge call, one lock-step batch of next sessions)."""
    parts = get_parts(kwargs)
    sample = _sample(solution_str, ground_truth, extra_info)
    scored = await asyncio.gather(*(_batcher(s).submit(sample) for s in scorers(parts)))
    return to_verl(parts, scored)
