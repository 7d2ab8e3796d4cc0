"""Write constraints/gpu.txt: the exact set `.[gpu]` resolves to on a linux x86_64 CUDA machine.

uv resolves it without installing anything (`uv pip compile`, a few seconds where pip's `--dry-run --report` took
minutes) for CPython of this interpreter's minor version on manylinux x86_64, whatever machine runs it; PyPI's
linux x86_64 torch wheels are the CUDA builds. Machine-local settings are set aside (uv's config files, and the
UV_/PIP_ variables that point at local wheels, indexes or constraints): a CPU constraints file or a folder of CPU
wheels would steer torch. Usage: `python tools/lock_gpu.py` (needs the index).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
GPU_TXT = ROOT / "constraints" / "gpu.txt"
# Variables that point a resolver at local wheels, indexes or constraints; certificates and proxies stay.
_LOCAL = ("PIP_CONSTRAINT", "PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX", "PIP_INDEX_URL")
PLATFORM = "x86_64-manylinux_2_28"


def resolve(extra: str = "gpu", constraints: Path | None = None) -> dict[str, str]:
    """What `.[extra]` (pyproject at ROOT) resolves to on linux x86_64, name -> version, memrl itself left out."""
    from uv import find_uv_bin

    env = {k: v for k, v in os.environ.items() if k not in _LOCAL and not k.startswith("UV_")}
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "resolved.txt"
        argv = [find_uv_bin(), "pip", "compile", "--no-config", "--quiet", "--no-header", "--no-annotate"]
        argv += ["--python-platform", PLATFORM, "--python-version", python, "--extra", extra, "-o", str(out)]
        argv += [*(["-c", str(constraints)] if constraints else []), "pyproject.toml"]
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"uv could not resolve .[{extra}]:\n{done.stderr[-3000:]}")
        pins = read_pins(out)
    pins.pop("memrl", None)
    return dict(sorted(pins.items()))


def read_pins(path: Path = GPU_TXT) -> dict[str, str]:
    """`name==version` lines of a constraints file, names canonical."""
    pins = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[canonicalize_name(name.split("[")[0])] = version.split(";")[0].strip()
    return pins


def main() -> None:
    pins = resolve()
    header = [
        '# Exact versions `pip install ".[gpu]"` resolves to on linux x86_64 (CUDA wheels from PyPI),',
        f"# CPython {platform.python_version_tuple()[0]}.{platform.python_version_tuple()[1]}. "
        "Written by tools/lock_gpu.py; tests/app/test_packaging.py checks it resolves and agrees with pyproject.",
    ]
    GPU_TXT.write_text("\n".join([*header, *(f"{n}=={v}" for n, v in pins.items())]) + "\n")
    print(f"{GPU_TXT}: {len(pins)} pins (torch {pins.get('torch')}, vllm {pins.get('vllm')})")


if __name__ == "__main__":
    main()
