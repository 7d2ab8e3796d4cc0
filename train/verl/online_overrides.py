"""An online GRPO stage (`collab_grpo`, `tod_grpo`) on verl: the Hydra overrides of `verl.trainer.main_ppo` that run
the agent loop.

The reflector's GRPO overrides (`memrl.train.verl.overrides`) with three differences: the data is the stage's own
agent-loop parquet (`online_data`), rolled out by vLLM in async mode through the `memrl_<world>` loop that its
`agent_name` column selects; the reward comes from the loop (no reward function: `reward_score`, NaN for an
unfinished episode, which `memrl_grpo` leaves out); and every training sample, with each reward part and its
episode, is written per step to `rollouts/<step>.jsonl` in the stage folder (`trainer.rollout_data_dir`).
"""

from __future__ import annotations

from typing import Unpack

from memrl.train.endpoints import Endpoint, stage_endpoints
from memrl.train.online.config import OnlineGRPOStage
from memrl.train.verl.online_data import EVAL_FILE, TRAIN_FILE, LoopSettings
from memrl.train.verl.overrides import VerlRun, kv, per_worker, stage_overrides, worker_count
from memrl.train.verl.rewards import ADV_MODULE

LOOP_MODULE = "memrl.train.verl.agent_loop"
# verl imports each (comma-separated) on `import verl` in every Ray process: the estimator and the agent loop.
EXTERNAL_MODULES = f"{ADV_MODULE},{LOOP_MODULE}"
DATA_SUBDIR, ROLLOUTS_SUBDIR = "data", "rollouts"
AGENT_WORKERS_KEY = "actor_rollout_ref.rollout.agent.num_workers"
AGENT_WORKERS = 8  # verl 0.9.1's default


def user_endpoints(stage: OnlineGRPOStage) -> list[Endpoint]:
    """The LLM user's endpoint, where the stage's user is an LLM behind one (a rule user calls none)."""
    return [e for e in stage_endpoints(stage) if e.role == "user"]


def agent_workers(stage: OnlineGRPOStage) -> int:
    """verl's agent-loop workers for the stage (each plays its sessions with its own user client)."""
    bounds = [e.model.max_concurrency for e in user_endpoints(stage)]
    return worker_count(AGENT_WORKERS, bounds, list(stage.overrides), AGENT_WORKERS_KEY)


def loop_settings(stage: OnlineGRPOStage) -> LoopSettings:
    """The loop's settings, the LLM user's `max_concurrency` divided over the agent-loop workers so that the user's
    server sees the recipe's bound."""
    env = stage.env
    if user_endpoints(stage):
        assert env.user_model is not None
        shared = per_worker(env.user_model.model_dump(), agent_workers(stage))
        env = env.model_copy(update={"user_model": env.user_model.model_validate(shared)})
    return LoopSettings(world=stage.world, env=env, reward=stage.reward, max_turn_tokens=stage.max_turn_tokens)


def online_overrides(stage: OnlineGRPOStage, **run: Unpack[VerlRun]) -> list[str]:
    """The policy's online GRPO: verl's async rollout through the `memrl_<world>` agent loop (`stage_overrides`)."""
    data = run["out_dir"] / DATA_SUBDIR
    return stage_overrides(
        stage,
        train_files=data / TRAIN_FILE,
        val_files=data / EVAL_FILE,
        external_modules=EXTERNAL_MODULES,
        task=[
            kv("actor_rollout_ref.rollout.mode", "async"),  # agent loops run only against the async server
            kv("actor_rollout_ref.rollout.multi_turn.enable", True),
            # set, not left to verl's default: the LLM user's max_concurrency is divided over exactly these workers
            kv(AGENT_WORKERS_KEY, agent_workers(stage)),
        ],
        trainer=[kv("trainer.rollout_data_dir", str(run["out_dir"] / ROLLOUTS_SUBDIR))],
        **run,
    )
