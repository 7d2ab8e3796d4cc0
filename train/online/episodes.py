"""The collab sessions a policy trains on: the rows of `CollabRLConfig`'s train-split users and their episodes,
played in-process or on Ray actors."""

from __future__ import annotations

from functools import partial

from memrl.envs.collab.grading import Grader
from memrl.envs.collab.rows import CollabEpisodes, policy_view, session_rows
from memrl.envs.collab.runner import assign_problems, select_problems, select_profiles
from memrl.envs.collab.user_sim import LLMUserSimulator, RuleUserSimulator
from memrl.envs.episode_actors import ActorEpisodes
from memrl.rollout.builder import build_backend
from memrl.train.online.config import CollabRLConfig


def episode_rows(cfg: CollabRLConfig) -> list[str]:
    """One JSON spec per (train user, session), in user order."""
    evaluation = cfg.eval_config()
    users = select_profiles(evaluation)
    plan = assign_problems(users, select_problems(evaluation), cfg.sessions, cfg.seed)
    return session_rows(users, plan, cfg.agent, cfg.reply)


def collab_episodes(cfg: CollabRLConfig, reply_tokens: int) -> CollabEpisodes:
    """The in-process source for `cfg`'s users (whatever `workers` says); arith, maths and choice tasks are graded
    by rule, so no judge model is needed."""
    grader = Grader()
    if cfg.user_model is None or cfg.simulator == "rule":
        return CollabEpisodes(RuleUserSimulator(grader, seed=cfg.seed), grader, cfg.max_turns, reply_tokens)
    backend = build_backend(cfg.user_model)
    simulator = LLMUserSimulator(backend, cfg.user_sampling.params())
    return CollabEpisodes(simulator, grader, cfg.max_turns, reply_tokens, [backend])


def episode_source(cfg: CollabRLConfig, reply_tokens: int) -> CollabEpisodes | ActorEpisodes:
    """The episodes of `cfg`: in-process, or on `cfg.workers` Ray actors (each with its own user simulator; the
    config travels pickled, an LLM user's key with it, never on a command line)."""
    if cfg.workers is None:
        return collab_episodes(cfg, reply_tokens)
    view = partial(policy_view, reply_tokens=reply_tokens)
    return ActorEpisodes(view, collab_episodes, (cfg, reply_tokens), cfg.workers, cfg.ray_address)
