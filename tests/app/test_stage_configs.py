"""Each stage kind's schema is the config model of the layer that does the work, plus its `kind`: a recipe key and a
field of that layer's model cannot drift apart, and the app layer defines no field of its own."""

from __future__ import annotations

import typing

import pytest
from pydantic import BaseModel

from memrl.app.stages.registry import KINDS
from memrl.data_gen.config import (
    GenerateConfig,
    JudgerDataConfig,
    PahfDataConfig,
    ReflectionDataConfig,
    TodDataConfig,
)
from memrl.train.evaluate import EvalReflectorConfig
from memrl.train.export import ExportConfig

OWNED = {
    "generate": GenerateConfig,
    "reflection_data": ReflectionDataConfig,
    "tod_data": TodDataConfig,
    "judger_data": JudgerDataConfig,
    "pahf_data": PahfDataConfig,
    "export": ExportConfig,
    "eval_reflector": EvalReflectorConfig,
}


@pytest.mark.parametrize(("kind", "config"), OWNED.items())
def test_a_stage_schema_is_its_layers_config_plus_kind(kind: str, config: type[BaseModel]) -> None:
    schema = KINDS[kind].config
    assert issubclass(schema, config)
    assert "kind" not in config.model_fields
    assert set(schema.model_fields) == {*config.model_fields, "kind"}
    assert typing.get_args(schema.model_fields["kind"].annotation) == (kind,)
    for name, field in config.model_fields.items():  # the same descriptions feed `--help` and the recipe docs
        assert schema.model_fields[name].description == field.description
