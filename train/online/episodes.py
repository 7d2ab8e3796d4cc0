"""The rows a policy trains on and their episodes, for any world the registry trains online: played in-process or
on Ray actors."""

from __future__ import annotations

from memrl.envs.episode_actors import ActorEpisodes
from memrl.envs.online import Episodes, OnlineConfig, OnlineEpisode, ViewSource
from memrl.envs.registry import online_of


def episode_rows(cfg: OnlineConfig) -> list[str]:
    """One JSON spec per episode to train on (a bad task, problem file or data folder fails here, before any model
    loads)."""
    return cfg.rows()


class InProcess:
    """An `EpisodeSource` in this process: a world's fresh episode of a spec, with the policy's view of its row."""

    def __init__(self, episodes: Episodes, view: ViewSource) -> None:
        self.episodes = episodes
        self.view = view

    def __call__(self, spec: str) -> OnlineEpisode:
        view = self.view(spec)
        return OnlineEpisode(self.episodes.episode(spec), view.context, view.read_reply)

    def close(self) -> None:
        self.episodes.close()


def policy_view(cfg: OnlineConfig, reply_tokens: int) -> ViewSource:
    """How the policy sees a row of `cfg`'s world (its prompt states `reply_tokens` where the world's does)."""
    view = online_of(cfg)[1].view
    return lambda spec: view(spec, reply_tokens)


def _episodes(cfg: OnlineConfig) -> Episodes:
    """What an actor builds (a module-level function: it travels to the actor pickled, with the config)."""
    return cfg.episodes()


def in_process(cfg: OnlineConfig, reply_tokens: int) -> InProcess:
    return InProcess(cfg.episodes(), policy_view(cfg, reply_tokens))


def episode_source(cfg: OnlineConfig, reply_tokens: int) -> InProcess | ActorEpisodes:
    """The episodes of `cfg`: in-process, or on `cfg.workers` Ray actors (each with its own user simulator; the
    config travels pickled, an LLM user's key with it, never on a command line)."""
    if cfg.workers is None:
        return in_process(cfg, reply_tokens)
    return ActorEpisodes(policy_view(cfg, reply_tokens), _episodes, (cfg,), cfg.workers, cfg.ray_address)
