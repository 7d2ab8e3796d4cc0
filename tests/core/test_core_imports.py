from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_importing_core_never_loads_torch() -> None:
    """Only a tiny model's builder loads torch (core/tiny.py, imported inside models.pull's builder)."""
    core = Path(__file__).parents[2] / "memrl" / "core"
    names = sorted(f"memrl.core.{p.stem}" for p in core.glob("*.py") if p.stem not in ("tiny", "__init__"))
    heavy = "print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    code = f"import importlib, sys\nfor n in {names!r}: importlib.import_module(n)\n{heavy}"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]" and "memrl.core.models" in names
