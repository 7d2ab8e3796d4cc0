"""DeepSpeed is an optional extra (`memrl[deepspeed]`): a run that asks for it without the package stops in one line."""

from __future__ import annotations

import sys

import pytest

from memrl.core.errors import ConfigError
from memrl.train.judger.deepspeed_zero import deepspeed_config


@pytest.mark.parametrize("ref", ["zero2", "zero3"])
def test_deepspeed_without_the_package_is_one_line(ref: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # not installed, as on a CPU install: find_spec says None
    with pytest.raises(ConfigError) as err:
        deepspeed_config(ref)
    assert str(err.value) == f"deepspeed: {ref!r} needs the deepspeed package: pip install 'memrl[deepspeed]'"
    # A plan (--dry-run) still names the config the run would use.
    assert deepspeed_config(ref, must_exist=False).name == f"{ref}.json"


def test_a_missing_json_is_reported_before_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "deepspeed", None)
    with pytest.raises(ConfigError, match="neither zero2 nor zero3 nor an existing JSON file"):
        deepspeed_config("zero4")
