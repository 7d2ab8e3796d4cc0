"""Pydantic bases: typed configs reject unknown keys; models of released data ignore them."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """Base of every typed config: unknown keys fail validation instead of being ignored."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LenientModel(BaseModel):
    """Reads released data that carries extra keys: keys the model does not name are ignored, not rejected."""

    model_config = ConfigDict(extra="ignore")
