"""Cores busy: CPU seconds of this process and every process it starts (servers, Ray workers), per wall second.

A sampler thread reads each process of the tree every `interval` seconds and keeps the last CPU time it saw per
process, so a process that exits between two samples loses at most one interval. Ray's own daemons (raylet, GCS)
are in the tree too: they are part of what a stage costs.
"""

from __future__ import annotations

import json
import os
import platform
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil


def cpu_model() -> str:
    """The processor's name (numerics and speed differ between CPU models: every result records it)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_result(out: Path, name: str, result: dict[str, Any]) -> Path:
    """`result` as `<out>/<name>.json`, the file `run_all.py` reads back."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def machine() -> dict[str, Any]:
    """What a benchmark's result records of the machine it ran on: the CPU model, its cores and the 1-minute load."""
    return {"cpu": cpu_model(), "cpus": os.cpu_count(), "load_1min": os.getloadavg()[0]}


@dataclass
class CpuBusy:
    interval: float = 0.5
    _seen: dict[tuple[int, float], float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _start_wall: float = 0.0
    _start_cpu: float = 0.0

    def _cpu(self) -> float:
        root = psutil.Process()
        for proc in [root, *root.children(recursive=True)]:
            try:
                with proc.oneshot():
                    times = proc.cpu_times()
                    self._seen[(proc.pid, proc.create_time())] = times.user + times.system
            except psutil.Error:  # exited between listing and reading: its last sample stands
                continue
        return sum(self._seen.values())

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._cpu()

    def __enter__(self) -> CpuBusy:
        self._start_cpu, self._start_wall = self._cpu(), time.perf_counter()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.seconds = time.perf_counter() - self._start_wall
        self.cpu_seconds = self._cpu() - self._start_cpu

    @property
    def cores(self) -> float:
        return round(self.cpu_seconds / self.seconds, 2) if self.seconds else 0.0
