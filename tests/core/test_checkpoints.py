"""A verl FSDP checkpoint told from a Hugging Face folder by its layout alone (export merges only the former)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memrl.core.checkpoints import is_verl_checkpoint, verl_shard_dir
from memrl.core.errors import ConfigError


def test_verl_shards_are_found_from_the_run_its_checkpoints_or_a_step(tmp_path: Path) -> None:
    actor = tmp_path / "checkpoints" / "global_step_20" / "actor"
    actor.mkdir(parents=True)
    (actor / "fsdp_config.json").write_text('{"FSDP_version": 2, "world_size": 8}')
    (tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("20\n")
    assert verl_shard_dir(tmp_path) == actor  # the run folder
    assert verl_shard_dir(tmp_path / "checkpoints") == actor
    assert verl_shard_dir(actor.parent) == actor
    assert verl_shard_dir(actor) == actor
    with pytest.raises(ConfigError, match="no verl FSDP checkpoint"):
        verl_shard_dir(tmp_path / "checkpoints" / "global_step_20" / "missing")
    assert is_verl_checkpoint(tmp_path) and not is_verl_checkpoint(tmp_path / "elsewhere")


def test_a_hugging_face_folder_is_not_a_verl_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "adapter_config.json").write_text("{}")
    assert not is_verl_checkpoint(tmp_path)
