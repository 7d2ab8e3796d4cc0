"""Write planned MS-TOD individuals session by session, with a resumable log."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memrl.core.files import ResumableJsonl, read_json
from memrl.data_gen.tod.plan import IndividualPlan
from memrl.data_gen.tod.session_writers import SessionWriter
from memrl.envs.tod.formats import Individual, Session, individual_path, write_individual
from memrl.envs.tod.schema import TodDataError


@dataclass
class GenerationStats:
    individuals: int = 0
    sessions: int = 0
    resumed_sessions: int = 0  # taken from the progress log of an earlier, interrupted run
    skipped_individuals: int = 0  # already complete on disk
    writer_fallbacks: int = 0  # sessions the LLM writer failed and the template wrote


PROGRESS = Path(".progress") / "sessions.jsonl"


def generate(
    plans: Sequence[IndividualPlan],
    writer: SessionWriter,
    out_dir: str | Path,
) -> GenerationStats:
    """Write every planned individual to `out_dir/persona_<id>.json`, resuming an interrupted run.

    Each session is appended to `out_dir/.progress/sessions.jsonl` (key `persona/session`) as soon as it is written;
    an individual's file appears, atomically, once all its sessions are there. A rerun skips finished individuals and
    reuses logged sessions, so nothing is written twice.
    """
    out = Path(out_dir)
    log = ResumableJsonl(out / PROGRESS)
    logged = {str(r["key"]): r for r in log.records()}
    stats = GenerationStats()
    for plan in plans:
        path = individual_path(out, plan.persona_id)
        if path.exists():
            stats.skipped_individuals += 1
            stats.writer_fallbacks += sum(bool(logged.get(s.key, {}).get("fallback")) for s in plan.sessions)
            continue
        todo = [sp for sp in plan.sessions if sp.key not in logged]
        stats.resumed_sessions += len(plan.sessions) - len(todo)
        # One call per individual lets a model writer batch its requests; each session is logged as it arrives.
        for sp, (session, fallback) in zip(todo, writer.write_many(todo), strict=True):
            record = {"key": sp.key, "fallback": fallback, "session": session.to_record()}
            log.append(record)
            logged[sp.key] = record
        sessions = []
        for sp in plan.sessions:
            record = logged[sp.key]
            stats.writer_fallbacks += bool(record.get("fallback"))
            sessions.append(Session.model_validate(record["session"]))
            stats.sessions += 1
        individual = Individual(persona_id=plan.persona_id, sessions=sessions)
        write_individual(individual, out)
        stats.individuals += 1
    return stats


def check_run_config(out_dir: str | Path, config: dict[str, Any]) -> None:
    """A rerun into the same folder must use the same settings, or resumed sessions would belong to another plan."""
    path = Path(out_dir) / ".progress" / "config.json"
    if path.exists():
        previous = read_json(path, TodDataError)
        for key, value in config.items():
            if previous.get(key) != value:
                raise TodDataError(
                    f"{out_dir} holds a run with {key}={previous.get(key)!r}, not {value!r}: resume it with the same "
                    "settings or write to a new folder"
                )
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(config, indent=1) + "\n")
