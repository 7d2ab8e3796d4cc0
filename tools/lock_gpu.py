"""Write constraints/gpu.txt: the exact set `pip install ".[gpu]"` resolves to on a linux x86_64 CUDA machine.

pip resolves without installing (`--dry-run --report`) against the package index, for the running CPython on this
platform; PyPI's linux x86_64 torch wheels are the CUDA builds. This machine's pip configuration and the
PIP_CONSTRAINT / PIP_FIND_LINKS variables are set aside: a CPU constraints file or a folder of CPU wheels would
steer torch. Usage: `python tools/lock_gpu.py` (a few minutes; needs the index).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
GPU_TXT = ROOT / "constraints" / "gpu.txt"
TARGET = ".[gpu]"
# Variables that point pip at local wheels or constraints; the index URL, certificates and proxies stay.
_LOCAL_PIP = ("PIP_CONSTRAINT", "PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX")


def resolve(target: str = TARGET, constraints: Path | None = None) -> dict[str, str]:
    """What pip would install for `target` (from ROOT), name -> version, memrl itself left out."""
    env = {k: v for k, v in os.environ.items() if k not in _LOCAL_PIP}
    env["PIP_CONFIG_FILE"] = os.devnull  # no config file at all: no machine-local index, wheels or constraints
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        argv = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
        argv += ["--report", str(report), *(["-c", str(constraints)] if constraints else []), target]
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"pip could not resolve {target}:\n{done.stderr[-3000:]}")
        installs = json.loads(report.read_text())["install"]
    pins = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in installs}
    pins.pop("memrl", None)
    return dict(sorted(pins.items()))


def read_pins(path: Path = GPU_TXT) -> dict[str, str]:
    """`name==version` lines of a constraints file, names canonical."""
    pins = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version.strip()
    return pins


def main() -> None:
    pins = resolve()
    header = [
        f'# Exact versions `pip install "{TARGET}"` resolves to on linux x86_64 (CUDA wheels from PyPI),',
        f"# CPython {platform.python_version_tuple()[0]}.{platform.python_version_tuple()[1]}. "
        "Written by tools/lock_gpu.py; tests/test_packaging.py checks it resolves and agrees with pyproject.",
    ]
    GPU_TXT.write_text("\n".join([*header, *(f"{n}=={v}" for n, v in pins.items())]) + "\n")
    print(f"{GPU_TXT}: {len(pins)} pins (torch {pins.get('torch')}, vllm {pins.get('vllm')})")


if __name__ == "__main__":
    main()
