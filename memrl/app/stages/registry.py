"""Every stage kind a recipe can name, in one table; the recipe schema's union is built from it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Protocol, Union

from pydantic import Field

from memrl.app.stages import actions, collab_rl, generate, heldout, judger, pull_models, reflection, training
from memrl.app.stages.base import StageKind

KINDS: dict[str, StageKind[Any]] = {
    kind.name: kind
    for kind in (
        pull_models.KIND,
        generate.KIND,
        reflection.REFLECTION_DATA,
        training.SFT,
        training.GRPO,
        collab_rl.COLLAB_GRPO,
        reflection.EXPORT,
        heldout.COLLAB_HELDOUT,
        reflection.EVAL_REFLECTOR,
        judger.JUDGER,
    )
} | {kind.name: kind for kind in actions.KINDS}


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
