"""Environments by name, as an online trainer plays them: a world's episodes built from JSON specs (dataset rows).

An entry holds the two halves `envs/online.py` describes: `episodes`, the world's `Episodes` class (built with its
resources: a user simulator, a grader), whose `episode(spec)` is a fresh `Episode` of one row, and `view`, how the
policy sees a row (`(spec, reply_tokens) -> PolicyView`). Only collab has both today. TOD and PAHF are episodes
too (`ProactiveEpisode`, `PahfEpisode`) but not yet rows: `NOT_ONLINE` says what each lacks, and `environment`
names it when asked for one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from memrl.core.errors import MemrlError
from memrl.envs.collab.rows import CollabEpisodes, policy_view
from memrl.envs.online import Episodes, PolicyView


@dataclass(frozen=True)
class Environment:
    episodes: Callable[..., Episodes]  # the world's resources -> its episodes by spec
    view: Callable[[str, int], PolicyView]  # (spec, the reply budget the prompt states) -> how the policy sees it


ENVIRONMENTS: Mapping[str, Environment] = {"collab": Environment(CollabEpisodes, policy_view)}

NOT_ONLINE: Mapping[str, str] = {
    "tod": "a session's episode needs the memory planner's selection and the reader's request built around it "
    "(`envs/tod/runner.py`); there is no row -> episode builder or policy prompt yet",
    "pahf": "a task's episode is built from a `Job` (`protocol.build_task`), but the policy's prompt needs the "
    "agent's memory summary and the task record its memory writes; there is no row format or policy view yet",
}


def environment(name: str) -> Environment:
    """The registered environment `name`; an error naming the trainable ones (and why `name` is not) otherwise."""
    if name in ENVIRONMENTS:
        return ENVIRONMENTS[name]
    why = f": {NOT_ONLINE[name]}" if name in NOT_ONLINE else ""
    raise MemrlError(f"environment {name!r} cannot be trained online{why} (trainable: {', '.join(ENVIRONMENTS)})")
