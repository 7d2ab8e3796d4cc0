"""Makes verl 0.9.1 build models beside TRL 1.16 (both are in memrl's environment).

verl's `apply_monkey_patch`, run on every FSDP model build (GRPO actor and reference, SFT), patches TRL's
value-head model whenever TRL is importable, and imports `AutoModelForCausalLMWithValueHead` from `trl` to do so.
TRL 1.16 no longer has that class, so the build dies with ImportError before any CUDA work. Value heads only
matter to a PPO critic built from TRL, which memrl never trains with verl: this module tells verl that TRL is absent.

verl imports it in each of its processes from VERL_USE_EXTERNAL_MODULES (memrl's verl jobs name it first there).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import verl.utils.import_utils as import_utils

# verl's modules bind `is_trl_available` by name on import: patch the source, and the copies already bound.
_BOUND_IN = ("verl.models.transformers.monkey_patch", "verl.utils.model")


def _trl_is_absent() -> bool:
    return False


def hide_trl_from_verl() -> None:
    """Make every verl check of `is_trl_available` answer False, in this process."""
    patched: Callable[[], bool] = _trl_is_absent
    import_utils.is_trl_available = patched  # type: ignore[assignment]
    for name in _BOUND_IN:
        module = sys.modules.get(name)
        if module is not None:
            module.is_trl_available = patched  # type: ignore[attr-defined]


hide_trl_from_verl()
