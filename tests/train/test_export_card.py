"""Exported model cards carry the Hub's `pipeline_tag` and `license`; a checkpoint not from verl is exported without
verl's merger; no caller passes transformers 5 the `safe_serialization` argument it ignores."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from huggingface_hub import ModelCard

from memrl.core.checkpoints import CheckpointInfo
from memrl.train.export import export_checkpoint

SOURCES = ("memrl", "train", "rollout", "rewards", "envs", "data_gen")


def test_export_card_has_pipeline_tag_and_the_base_models_license(tiny_qwen2: str, tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    for item in Path(tiny_qwen2).iterdir():
        (base / item.name).symlink_to(item)
    (base / "README.md").write_text("---\nlicense: apache-2.0\n---\n# base\n")
    CheckpointInfo(str(base), "trl-sft", "sft", 3, False).save(base)
    out = export_checkpoint(base, tmp_path / "export")
    card = ModelCard.load(out / "README.md")
    assert (card.data.pipeline_tag, card.data.license, card.data.library_name) == (
        "text-generation", "apache-2.0", "transformers")  # fmt: skip
    assert card.data.base_model == str(base)
    assert json.loads((out / "memrl_export.json").read_text())["license"] == "apache-2.0"
    assert (out / "model.safetensors").is_file()


def test_export_of_a_base_without_a_card_says_unknown(tiny_qwen2: str, tmp_path: Path) -> None:
    out = export_checkpoint(Path(tiny_qwen2), tmp_path / "export")
    assert ModelCard.load(out / "README.md").data.license == "unknown"


def test_exporting_a_hugging_face_checkpoint_never_loads_verls_merger(tiny_qwen2: str, tmp_path: Path) -> None:
    probe = (
        "import sys; from pathlib import Path; from memrl.train.export import export_checkpoint\n"
        "export_checkpoint(Path(sys.argv[1]), Path(sys.argv[2]))\n"
        "print(sorted(m for m in sys.modules if m.startswith('memrl.train.verl')))"
    )
    argv = [sys.executable, "-c", probe, tiny_qwen2, str(tmp_path / "export")]
    assert subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip() == "[]"


def test_no_caller_passes_safe_serialization() -> None:
    root = Path(__file__).parents[2]
    hits = [str(p) for d in SOURCES for p in (root / d).rglob("*.py") if "safe_serialization" in p.read_text()]
    assert hits == []
