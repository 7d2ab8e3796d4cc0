from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from memrl.app.recipe import bundled_recipes, load_recipe
from memrl.app.stages.generate import GenerateStage
from memrl.core.errors import ConfigError
from memrl.rollout.config import OpenAIModelConfig


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_every_bundled_recipe_validates() -> None:
    assert {"base", "quickstart", "generate", "endpoint", "reflector-qwen2.5-7b", "reflector-llama3.1-8b"} <= set(
        bundled_recipes()
    )
    for name in bundled_recipes():
        load_recipe(name)


def test_extends_merges_deeply_and_child_wins(tmp_path: Path) -> None:
    write(
        tmp_path / "parent.yaml",
        "extends: generate\nname: parent\nstages:\n  generate:\n    sampling:\n      max_tokens: 7\n",
    )
    child = write(tmp_path / "child.yaml", "extends: parent.yaml\nname: child\nseed: 3\n")
    recipe = load_recipe(child).recipe
    stage = recipe.stages["generate"]
    assert isinstance(stage, GenerateStage)
    assert (recipe.name, recipe.seed, stage.sampling.max_tokens) == ("child", 3, 7)
    assert stage.system == "You are a concise assistant."  # inherited from generate through parent
    assert list(recipe.stages) == ["pull", "generate"]


def test_extends_cycle_is_reported(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", "extends: b.yaml\nname: a\n")
    write(tmp_path / "b.yaml", "extends: a.yaml\nname: b\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_recipe(tmp_path / "a.yaml")


def test_dotted_overrides_parse_yaml_values() -> None:
    recipe = load_recipe(
        "generate",
        ["seed=7", "stages.generate.sampling.temperature=0.5", "stages.generate.sampling.stop=[END, '###']"],
    ).recipe
    stage = recipe.stages["generate"]
    assert isinstance(stage, GenerateStage)
    assert recipe.seed == 7
    assert stage.sampling.temperature == 0.5
    assert stage.sampling.stop == ["END", "###"]


def test_unknown_key_names_it_and_the_closest_valid_key() -> None:
    with pytest.raises(ConfigError) as err:
        load_recipe("generate", ["stages.generate.sampling.temprature=0.2"])
    message = str(err.value)
    assert "unknown key 'stages.generate.sampling.temprature'" in message
    assert "did you mean 'temperature'" in message
    assert "\n" not in message


def test_unknown_key_inside_a_discriminated_model(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'models.policy.endpiont' \(did you mean 'endpoint'\?\)"):
        load_recipe("endpoint", ["models.policy.endpiont=http://x"])


def test_wrong_type_names_key_and_expected_type() -> None:
    with pytest.raises(ConfigError) as err:
        load_recipe("generate", ["stages.generate.sampling.max_tokens=many"])
    assert "stages.generate.sampling.max_tokens: expected a valid integer" in str(err.value)
    assert "'many'" in str(err.value)


def test_wrong_backend_tag_and_missing_key() -> None:
    with pytest.raises(
        ConfigError, match=r"models\.policy\.backend: expected one of 'hf', 'openai', 'vllm', got 'tgi'"
    ):
        load_recipe("generate", ["models.policy.backend=tgi"])
    with pytest.raises(ConfigError, match=r"required key 'models\.judge\.model' is missing"):
        load_recipe("generate", ["models.judge.backend=hf"])
    with pytest.raises(ConfigError, match=r"required key 'models\.judge\.backend' is missing"):
        load_recipe("generate", ["models.judge.model=tiny-qwen2"])


def test_stage_must_reference_a_defined_model() -> None:
    with pytest.raises(ConfigError, match="'judge' is not a key of `models`"):
        load_recipe("generate", ["stages.generate.model=judge"])


def test_malformed_yaml_names_the_line(tmp_path: Path) -> None:
    bad = write(tmp_path / "bad.yaml", "name: bad\nstages:\n  x: [unclosed\n")
    with pytest.raises(ConfigError, match=r"malformed YAML at line \d"):
        load_recipe(bad)


def test_malformed_override_and_unknown_recipe() -> None:
    with pytest.raises(ConfigError, match=r"not of the form dotted\.key=value"):
        load_recipe("generate", ["seed"])
    with pytest.raises(ConfigError, match="did you mean 'quickstart'"):
        load_recipe("quickstrat")


def test_env_interpolation_defaults_and_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMRL_ENDPOINT", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-live-123")
    model = load_recipe("endpoint").recipe.models["policy"]
    assert isinstance(model, OpenAIModelConfig)
    assert model.endpoint == "http://127.0.0.1:8000/v1"
    assert model.api_key is not None and model.api_key.get_secret_value() == "sk-live-123"
    with pytest.raises(ConfigError, match="environment variable MEMRL_NOT_SET is not set"):
        load_recipe("endpoint", ["models.policy.endpoint=${MEMRL_NOT_SET}"])


def test_whole_value_env_reference_takes_the_fields_type(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMRL_SEED", "11")
    assert load_recipe("generate", ["seed=${MEMRL_SEED}"]).recipe.seed == 11


def test_saved_recipe_keeps_references_never_secrets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-live-123")
    loaded = load_recipe("endpoint")
    saved = loaded.save(tmp_path).read_text()
    assert "sk-live-123" not in saved
    assert "sk-live-123" not in repr(loaded.recipe) and "sk-live-123" not in str(loaded.recipe)
    data = yaml.safe_load(saved)
    assert data["models"]["policy"]["api_key"] == "${OPENAI_API_KEY:-EMPTY}"
    assert data["stages"]["generate"]["sampling"]["top_p"] == 1.0  # defaults are filled in
    # The saved file is itself a valid recipe that resolves to the same config.
    assert load_recipe(tmp_path / "recipe.resolved.yaml").recipe == loaded.recipe


def test_literal_secret_is_masked_when_saved(tmp_path: Path) -> None:
    loaded = load_recipe("endpoint", ["models.policy.api_key=sk-typed-in"])
    assert "sk-typed-in" not in loaded.save(tmp_path).read_text()
