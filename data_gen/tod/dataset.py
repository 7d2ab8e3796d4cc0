"""`memrl data tod`: MS-TOD individuals from SGD dialogues, their memory banks, the schema subset and stats.

Layout under `out`:
- `persona_<id>.json`: one individual in the MS-TOD format (plus the `slots` / `stage` annotations).
- `memory/persona_<id>.json`: its memory bank.
- `schema.json`: the SGD schemas of the services the tasks use.
- `stats.json`: sizes of the data and how often the models had to be replaced by templates.
- `.progress/`: the resumable session log and the run's settings (a rerun with the same settings resumes).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memrl.core.files import atomic_write_json
from memrl.data_gen.config import TodDataConfig
from memrl.data_gen.tod.goals import Goal, extract_goals, value_pool
from memrl.data_gen.tod.individuals import GenerationStats, check_run_config, generate
from memrl.data_gen.tod.plan import IndividualPlan
from memrl.data_gen.tod.plan import plan_individuals as plan
from memrl.data_gen.tod.session_writers import LLMWriter, SessionWriter, TemplateWriter
from memrl.envs.tod.formats import Individual, load_individual
from memrl.envs.tod.memory import (
    LLMMemoryBuilder,
    MemoryBuilder,
    TemplateMemoryBuilder,
    build_memory_bank,
    memory_path,
    write_memory_bank,
)
from memrl.envs.tod.schema import Schemas, TodDataError, load_schemas
from memrl.envs.tod.sgd import dialogue_files
from memrl.rollout.base import ChatBackend, SamplingParams


@dataclass(frozen=True)
class Source:
    schemas: Schemas
    goals: list[Goal]
    files: list[Path]


def load_source(sgd_dir: str | Path) -> Source:
    files = dialogue_files(sgd_dir)
    if not files:
        raise TodDataError(f"{sgd_dir}: no dialogues_*.json (in the folder or its train/dev/test subfolders)")
    schemas = load_schemas(sgd_dir)
    return Source(schemas, extract_goals(files, schemas), files)


def plan_from(source: Source, cfg: TodDataConfig) -> list[IndividualPlan]:
    pool = value_pool(source.goals, source.schemas)
    return plan(source.goals, cfg.individuals, cfg.tasks_per_individual, cfg.seed, pool)


def make_backend(spec: str) -> ChatBackend:
    from memrl.rollout.builder import build_backend
    from memrl.rollout.config import model_from_spec

    return build_backend(model_from_spec(spec))


def make_writer(cfg: TodDataConfig, schemas: Schemas, backend: ChatBackend | None) -> SessionWriter:
    if backend is None:
        return TemplateWriter(schemas, cfg.seed)
    return LLMWriter(backend, schemas, SamplingParams(temperature=0.7, max_tokens=768, seed=cfg.seed), seed=cfg.seed)


def make_memory_builder(cfg: TodDataConfig, backend: ChatBackend | None) -> MemoryBuilder:
    if cfg.memory == "template":
        return TemplateMemoryBuilder()
    if backend is None:
        raise TodDataError("--memory llm builds memory with the writer's model: pass --writer MODEL or MODEL@URL")
    return LLMMemoryBuilder(backend, SamplingParams(temperature=0.0, max_tokens=384, seed=cfg.seed))


def dataset_stats(
    individuals: Sequence[Individual], source: Source, cfg: TodDataConfig, gen: GenerationStats, memory_failures: int
) -> dict[str, Any]:
    sessions = [s for ind in individuals for s in ind.sessions]
    tasks = [t for ind in individuals for t in ind.tasks().values()]
    per_person = [len(ind.sessions) for ind in individuals]
    return {
        "config": cfg.model_dump(mode="json"),
        "sgd_files": [str(f) for f in source.files],
        "goals_available": len(source.goals),
        "individuals": len(individuals),
        "tasks": len(tasks),
        "tasks_by_sessions": {str(k): v for k, v in sorted(Counter(len(t) for t in tasks).items())},
        "sessions": len(sessions),
        "sessions_by_stage": dict(sorted(Counter(str(s.stage) for s in sessions).items())),
        "sessions_per_individual": {
            "min": min(per_person),
            "mean": round(statistics.mean(per_person), 2),
            "max": max(per_person),
        },
        "turns": sum(len(s.turns) for s in sessions),
        "min_turns_per_session": min(len(s.turns) for s in sessions),
        "tasks_by_service_intent": dict(sorted(Counter(f"{t[0].service}/{t[0].intent}" for t in tasks).items())),
        "slots_per_goal": {
            str(k): v
            for k, v in sorted(Counter(len(ind.confirmed(ref)) for ind in individuals for ref in ind.tasks()).items())
        },
        "writer_fallbacks": gen.writer_fallbacks,
        "memory_failures": memory_failures,
    }


def build_tod_dataset(
    cfg: TodDataConfig, out: str | Path, writer: SessionWriter | None = None
) -> tuple[dict[str, Any], GenerationStats]:
    """Generate (or resume) the dataset under `out`; returns the stats written to `out/stats.json` and the run's
    own counters (resumed and skipped work). `writer` overrides the one `cfg.writer` names (tests inject failures)."""
    out = Path(out)
    source = load_source(cfg.sgd_dir)
    plans = plan_from(source, cfg)
    check_run_config(out, cfg.model_dump(mode="json"))
    needs_model = cfg.writer != "template" and (writer is None or cfg.memory == "llm")
    backend = make_backend(cfg.writer) if needs_model else None
    try:
        builder = make_memory_builder(cfg, backend)
        gen = generate(plans, writer or make_writer(cfg, source.schemas, backend), out)
        individuals = [load_individual(out / f"persona_{p.persona_id}.json") for p in plans]
        for ind in individuals:
            if not memory_path(out, ind.persona_id).exists():  # a rerun keeps the banks already built
                write_memory_bank(build_memory_bank(ind, source.schemas, builder), out)
    finally:
        if backend is not None:
            backend.close()
    used = {s.service for ind in individuals for s in ind.sessions}
    source.schemas.subset(used).write(out / "schema.json")
    stats = dataset_stats(individuals, source, cfg, gen, builder.failures)
    atomic_write_json(out / "stats.json", stats)
    return stats, gen


def summary(stats: dict[str, Any], gen: GenerationStats) -> dict[str, Any]:
    """What `memrl data tod` prints: the dataset's sizes and this run's resumed and skipped work."""
    keys = ("individuals", "tasks", "sessions", "turns", "goals_available", "writer_fallbacks", "memory_failures")
    return {**{k: stats[k] for k in keys}, "resumed_sessions": gen.resumed_sessions, "skipped": gen.skipped_individuals}
