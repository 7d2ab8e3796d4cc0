"""The reward of a finished episode as data: named parts read from the episode's record, and one weight per part.

A world that trains online names its reward as a `PartWeights` subclass: one float field per part (the field order
is the order trainers get them: TRL one reward function per part, verl the dict of parts) and `parts(record)`, the
parts of one finished episode. `total` is the one weighted sum: verl's agent loop scores with it, TRL sums the same
weights itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memrl.core.schema import StrictModel

Record = Mapping[str, Any]


class PartWeights(StrictModel):
    """One weight per reward part, the fields in part order; a subclass says how a record scores each part."""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(cls.model_fields)

    @staticmethod
    def parts(record: Record) -> dict[str, float | None]:
        """Each part of a finished episode's record; None where the episode gives the part nothing to measure."""
        raise NotImplementedError

    def as_list(self) -> list[float]:
        return [getattr(self, part) for part in self.names()]

    def total(self, parts: Mapping[str, float | None]) -> float:
        """The weighted sum of `parts`; a part that is None adds nothing, as TRL sums the other parts."""
        return sum(
            w * v for w, v in zip(self.as_list(), (parts[p] for p in self.names()), strict=True) if v is not None
        )
