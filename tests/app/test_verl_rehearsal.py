"""A CPU rehearsal of verl's GPU path (verl 0.9.1, trainer.use_v1): every module its V1 task runner and workers
import, its worker configs built from the shipped 7B recipe's composed overrides, and the model loaded and run the way
its FSDP engine does, with the attention the overrides name. Everything short of a CUDA kernel."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tomllib

pytest.importorskip("verl")

REPO = Path(__file__).resolve().parents[2]
# That every module of the V1 runner and its workers imports without verl-core: test_packaging.py's
# test_verl_trainers_import_without_verl_core (one interpreter importing both lists).


def test_transfer_queue_is_what_the_verl_extra_installs() -> None:
    """verl's V1 runner imports transfer_queue; verl lists it only under its `verl-core` extra, which memrl omits."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    optional = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    declared = {canonicalize_name(Requirement(r).name): Requirement(r) for r in optional["verl"]}
    owner = canonicalize_name(metadata.packages_distributions()["transfer_queue"][0])
    assert owner in declared, f"the verl extra should name {owner}"
    assert declared[owner].specifier.contains(metadata.version(owner))
    for pinned in ("cpu.txt", "gpu.txt"):
        assert f"{owner}=={metadata.version(owner)}" in (REPO / "constraints" / pinned).read_text().splitlines()


# --- the composed worker configs and the model verl's FSDP engine loads ------------------------------------------


def _recipe_overrides(tiny: str, tmp: Path) -> tuple[list[str], list[str]]:
    """The GRPO and SFT overrides of the shipped reflector-qwen2.5-7b recipe, as its dry run composes them, with the
    model path pointed at a local tiny model (verl's configs load the model's config and tokenizer)."""
    from memrl.app.recipe import load_recipe
    from memrl.train.config import GRPOStage, SFTStage
    from memrl.train.verl.overrides import grpo_overrides, sft_overrides

    stages = load_recipe("reflector-qwen2.5-7b").recipe.stages
    grpo, sft = stages["grpo"], stages["sft"]
    assert isinstance(grpo, GRPOStage) and isinstance(sft, SFTStage) and grpo.trainer == sft.trainer == "verl"
    where = {"model_path": tiny, "data_dir": tmp / "data", "out_dir": tmp / "out", "experiment": "r"}
    return grpo_overrides(grpo, **where), sft_overrides(sft, **where)


@pytest.fixture(scope="module")
def configs(tiny_qwen2: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """verl's own model configs (HFModelConfig) of each model a reflector-qwen2.5-7b job loads with FSDP."""
    from verl.utils.config import omega_conf_to_dataclass

    from memrl.train.verl.validate import PPO_CONFIG, SFT_CONFIG, compose, validate_overrides

    grpo, sft = _recipe_overrides(tiny_qwen2, tmp_path_factory.mktemp("rehearsal"))
    validate_overrides(PPO_CONFIG, grpo)  # what the dry run checks
    validate_overrides(SFT_CONFIG, sft)
    ppo_cfg, sft_cfg = compose(PPO_CONFIG, grpo), compose(SFT_CONFIG, sft)
    assert ppo_cfg.trainer.use_v1
    # ActorRolloutRefWorker.init_model builds the actor's and the reference's from actor_rollout_ref.model; the SFT
    # trainer (_build_config) from model. A GRPO stage has no critic (need_critic: false for memrl_grpo).
    return {
        "actor/ref": omega_conf_to_dataclass(ppo_cfg.actor_rollout_ref.model),
        "sft": omega_conf_to_dataclass(sft_cfg.model),
        "ppo_cfg": ppo_cfg,
    }


@pytest.mark.parametrize("role", ["actor/ref", "sft"])
def test_every_model_verl_loads_asks_for_sdpa(configs: dict[str, Any], role: str) -> None:
    from verl.trainer.ppo.utils import need_critic

    model = configs[role]
    assert model.hf_config._attn_implementation == "sdpa"
    assert model.use_remove_padding is True
    assert not need_critic(configs["ppo_cfg"])


def _engine_module(model_config: Any) -> Any:
    """The module as verl's FSDPEngine._build_module loads it (before FSDP wraps it): the auto class for the config,
    from_pretrained with the composed hf_config (its attn_implementation included)."""
    import torch
    from verl.utils.model import get_hf_auto_model_class

    auto_class = get_hf_auto_model_class(hf_config=model_config.hf_config)
    module = auto_class.from_pretrained(
        pretrained_model_name_or_path=model_config.local_path,
        torch_dtype=torch.float32,
        config=model_config.hf_config,
        trust_remote_code=model_config.trust_remote_code,
    )
    return module.eval()


def test_verls_model_patch_runs_beside_the_pinned_trl(configs: dict[str, Any]) -> None:
    """The next step of FSDPEngine._build_module: verl's monkey patch. verl 0.9.1 patches TRL's value-head model
    whenever TRL is importable, and TRL 1.16 no longer has it: the external modules every memrl verl job names (GRPO
    in its runtime env, SFT in its command's env) start with the patch that hides TRL from verl."""
    from verl.models.transformers.monkey_patch import apply_monkey_patch
    from verl.utils.import_utils import import_external_libs

    from memrl.train.verl.overrides import COMPAT_MODULE, MODULES_ENV, verl_modules

    grpo_modules = configs["ppo_cfg"].ray_kwargs.ray_init.runtime_env.env_vars[MODULES_ENV].split(",")
    sft_modules = verl_modules()[MODULES_ENV].split(",")
    assert grpo_modules[0] == sft_modules[0] == COMPAT_MODULE
    import_external_libs(grpo_modules)  # what `import verl` does with VERL_USE_EXTERNAL_MODULES in each process
    model_config = configs["actor/ref"]
    module = _engine_module(model_config)
    apply_monkey_patch(model=module, use_remove_padding=model_config.use_remove_padding, ulysses_sp_size=1)


def test_the_packed_forward_under_sdpa_matches_each_sequence_alone(configs: dict[str, Any]) -> None:
    """use_remove_padding with SDPA: verl packs a micro batch into one row with restarting position ids and no
    attention mask (FSDPEngineWithLMHead.prepare_model_inputs); transformers builds a per-sequence causal mask from
    those position ids, so each sequence's logits are those it has alone."""
    import torch
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    model_config = configs["actor/ref"]
    module = _engine_module(model_config)
    assert module.config._attn_implementation == "sdpa"
    torch.manual_seed(0)
    lengths = [7, 12, 3]
    sequences = [torch.randint(10, 200, (n,)) for n in lengths]
    micro_batch = tu.get_tensordict(
        {
            "input_ids": torch.nested.as_nested_tensor(sequences, layout=torch.jagged),
            "position_ids": torch.nested.as_nested_tensor([torch.arange(n) for n in lengths], layout=torch.jagged),
            "temperature": torch.ones(len(lengths)),
        }
    )
    tu.assign_non_tensor_data(micro_batch, "use_remove_padding", model_config.use_remove_padding)
    engine = object.__new__(FSDPEngineWithLMHead)  # only its input packing, which reads these three settings
    engine.pad_to_length, engine.use_ulysses_sp, engine.pass_packed_cu_seqlens = False, False, False
    inputs, _ = engine.prepare_model_inputs(micro_batch)
    assert inputs["attention_mask"] is None and inputs["input_ids"].shape == (1, sum(lengths))
    with torch.no_grad():
        packed = module(**inputs, use_cache=False).logits[0]
        alone = torch.cat([module(input_ids=s[None], use_cache=False).logits[0] for s in sequences])
    torch.testing.assert_close(packed, alone, rtol=1e-4, atol=1e-4)
