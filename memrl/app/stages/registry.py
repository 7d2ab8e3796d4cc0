"""Every stage kind a recipe can name, in one table: the recipe schema's union and the `memrl eval|data` commands
(the kinds' CLI faces) are built from it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Protocol, Union

from pydantic import Field

from memrl.app.actions import Action
from memrl.app.actions.collab import EVAL_COLLAB
from memrl.app.actions.judger import EVAL_JUDGER
from memrl.app.actions.pahf import EVAL_PAHF, PAHF_DATA
from memrl.app.actions.tod import EVAL_TOD, JUDGER_DATA, TOD_DATA
from memrl.app.stages import generate, heldout, judger, online_rl, pull_models, reflection, training
from memrl.app.stages.actions import action_stage
from memrl.app.stages.base import StageKind

# The kinds that are also a command: each action is its kind's CLI face (`memrl eval tod` runs kind `eval_tod`).
_FACES: tuple[Action[Any], ...] = (EVAL_COLLAB, EVAL_JUDGER, EVAL_TOD, EVAL_PAHF, TOD_DATA, JUDGER_DATA, PAHF_DATA)

_KINDS: tuple[StageKind[Any], ...] = (
    pull_models.KIND,
    generate.KIND,
    reflection.REFLECTION_DATA,
    training.SFT,
    training.GRPO,
    *online_rl.ONLINE_KINDS,  # `<world>_grpo` for every world of memrl.envs.registry that trains online
    reflection.EXPORT,
    heldout.COLLAB_HELDOUT,
    reflection.EVAL_REFLECTOR,
    judger.JUDGER,
    *map(action_stage, _FACES),
)
KINDS: dict[str, StageKind[Any]] = {kind.name: kind for kind in _KINDS}


class StageSpec(Protocol):
    """What code outside a stage's own module may rely on: its kind's name."""

    @property
    def kind(self) -> str: ...


if TYPE_CHECKING:  # a union built at run time is no type to mypy
    StageConfig = StageSpec
else:
    StageConfig = Annotated[Union[tuple(kind.config for kind in KINDS.values())], Field(discriminator="kind")]  # noqa: UP007


def kind_of(stage: StageSpec) -> StageKind[Any]:
    return KINDS[stage.kind]
