"""`memrl data judger`: (query, memory QA pair) rows with relevance labels, split by individual.

A query is a confirming session seen up to its confirmation; its candidates are every QA pair of the individual's
earlier sessions. The labels are `envs/tod/labels.py`'s.

Layout: `J/train/pairs.jsonl`, `J/eval/pairs.jsonl`, `J/stats.json`.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from memrl.core.errors import MemrlError
from memrl.core.files import atomic_write_json
from memrl.core.outcomes import NothingDoneError
from memrl.core.schema import check_disjoint as check_splits_disjoint
from memrl.data_gen.config import JudgerDataConfig
from memrl.data_gen.judger_pairs import JudgerPair, write_pairs
from memrl.envs.tod.extract import folder_schemas
from memrl.envs.tod.formats import Individual, LoadProblems, Session, as_dicts, load_tod_dir
from memrl.envs.tod.labels import NEGATIVE_KINDS, label
from memrl.envs.tod.memory import (
    LLMMemoryBuilder,
    MemoryBank,
    MemoryBuilder,
    TemplateMemoryBuilder,
    load_memory_banks,
    memory_coverage,
)
from memrl.envs.tod.reasoning import filled_slots, schema_intent_query, schema_missing_slots
from memrl.envs.tod.schema import Schemas, TodDataError, load_schemas
from memrl.rollout.base import SamplingParams

SPLITS = ("train", "eval")


def query_rows(ind: Individual, session: Session, bank: MemoryBank, schemas: Schemas) -> list[JudgerPair]:
    """One row per QA pair of the sessions before `session` (a confirming session that can be scored)."""
    assert session.confirmation_state is not None
    goal = session.confirmation_state.slot_values
    context = session.context()
    filled = filled_slots(context, goal)
    intent = schemas.intent(session.service, session.intent)
    missing = schema_missing_slots(context, intent, goal)
    query_id = f"{ind.persona_id}/{session.session_id}"
    turns = tuple(as_dicts(context))
    intent_query = schema_intent_query(context, session.service, session.intent, schemas, goal)
    descriptions = tuple(schemas.slot(session.service, s).description for s in missing)
    rows = []
    for unit in bank.before(session.session_id):
        for pair in unit.qa:
            kind = label(session, goal, filled, unit.reference_dialogue_id, unit.intent, pair.slot, pair.answer)
            rows.append(
                JudgerPair(
                    key=f"{query_id}/{unit.session_id}/{pair.slot}",
                    query_id=query_id,
                    persona_id=ind.persona_id,
                    session_id=session.session_id,
                    service=session.service,
                    intent=session.intent,
                    context=turns,
                    intent_query=intent_query,
                    missing_slots=tuple(missing),
                    missing_descriptions=descriptions,
                    memory_session_id=unit.session_id,
                    memory_intent=unit.intent_description,
                    memory_service=unit.service,
                    slot=pair.slot,
                    question=pair.question,
                    answer=pair.answer,
                    label=int(kind is None),
                    negative=kind,
                )
            )
    return rows


def individual_rows(ind: Individual, bank: MemoryBank, schemas: Schemas) -> list[JudgerPair]:
    return [r for s in ind.sessions if s.scored for r in query_rows(ind, s, bank, schemas)]


def split_individuals(
    persona_ids: Sequence[int], eval_individuals: int | None = None, eval_fraction: float | None = None, seed: int = 0
) -> tuple[list[int], list[int]]:
    """(train ids, eval ids): a seeded draw of whole individuals, so no person is in both."""
    ids = sorted(set(persona_ids))
    if eval_individuals is None:
        fraction = 0.2 if eval_fraction is None else eval_fraction
        if not 0 < fraction < 1:
            raise MemrlError(f"--eval-fraction must be between 0 and 1, got {fraction}")
        eval_individuals = max(1, round(fraction * len(ids)))
    if not 0 < eval_individuals < len(ids):
        raise MemrlError(
            f"--eval-individuals {eval_individuals}: each split needs at least 1 individual, the data holds {len(ids)}"
        )
    rng = random.Random(seed)
    held = sorted(rng.sample(ids, eval_individuals))
    return [i for i in ids if i not in held], held


def check_disjoint(train: Iterable[JudgerPair], eval_: Iterable[JudgerPair]) -> None:
    """Fail when a persona id appears in both splits' rows."""
    check_splits_disjoint(
        train,
        eval_,
        key=lambda r: r.persona_id,
        message="train and eval share {n} individual(s): persona {shared}; split the judger data by individual",
        error=MemrlError,
    )


def split_stats(rows: Sequence[JudgerPair]) -> dict[str, Any]:
    positives = sum(r.label for r in rows)
    kinds = Counter(str(r.negative) for r in rows if not r.label)
    queries = Counter(r.query_id for r in rows)
    gold = {r.query_id for r in rows if r.label}
    return {
        "rows": len(rows),
        "queries": len(queries),
        "individuals": len({r.persona_id for r in rows}),
        "positives": positives,
        "negatives": len(rows) - positives,
        "positive_rate": round(positives / len(rows), 4) if rows else 0.0,
        "negatives_by_kind": {k: kinds.get(k, 0) for k in NEGATIVE_KINDS},
        "queries_without_positive": len(queries) - len(gold),
        "candidates_per_query": round(len(rows) / len(queries), 2) if queries else 0.0,
    }


def schema_path(tod_dir: str | Path, schema: str | Path | None = None) -> Path:
    """`schema` (an SGD schema.json, or an SGD folder: its train/dev/test schemas merged), else TOD_DIR/schema.json."""
    path = Path(schema) if schema is not None else Path(tod_dir) / "schema.json"
    if not path.exists():
        raise TodDataError(f"{path}: schema not found (pass --schema with an SGD schema.json or an SGD folder)")
    return path


def tod_schemas(tod_dir: str | Path, schema: str | Path | None = None) -> Schemas:
    return load_schemas(schema_path(tod_dir, schema))


def memory_builder(schema: Path, writer: str | None, seed: int = 0) -> MemoryBuilder:
    """The memory writer for sessions without a stored bank: the text extractor (its lexicon from the SGD dialogues
    beside `schema`), or the LLM writer `writer` (MODEL or MODEL@URL) with the extractor as its per-session fallback."""
    offline = TemplateMemoryBuilder(lexicon_from=schema)
    if writer is None:
        return offline
    from memrl.rollout.builder import build_backend
    from memrl.rollout.config import model_from_spec

    params = SamplingParams(temperature=0.0, max_tokens=384, seed=seed)
    return LLMMemoryBuilder(build_backend(model_from_spec(writer)), params, template=offline)


def build_judger_dataset(cfg: JudgerDataConfig, out: str | Path) -> dict[str, Any]:
    """Rows for every confirming session of `tod_dir`, split by individual, written under `out`; returns the stats.

    Lenient by default: foreign slots are dropped, confirming sessions no score can use are no query (their turns
    stay memory), unreadable files are skipped, each counted and named in the stats' `problems`; `strict` fails on
    the first of them instead. Memory, missing slots and queries read the folder's schema (`folder_schemas`).
    Without a stored `memory/` bank, memory is written from each session's words (`memory_builder`);
    `stats["memory"]` says how many confirmed values it holds.
    """
    tod_dir, seed = cfg.tod_dir, cfg.seed
    path = schema_path(tod_dir, cfg.schema_file)
    problems = None if cfg.strict else LoadProblems()
    merged = load_schemas(path)
    individuals = load_tod_dir(tod_dir, merged, problems)
    schemas = folder_schemas(individuals, merged)
    builder = memory_builder(path, cfg.memory_writer, seed)
    banks = load_memory_banks(tod_dir, individuals, schemas, builder)
    persona_ids = [i.persona_id for i in individuals]
    train_ids, eval_ids = split_individuals(persona_ids, cfg.eval_individuals, cfg.eval_fraction, seed)
    by_id = {i.persona_id: i for i in individuals}
    splits = {
        name: [r for pid in ids for r in individual_rows(by_id[pid], banks[pid], schemas)]
        for name, ids in (("train", train_ids), ("eval", eval_ids))
    }
    check_disjoint(splits["train"], splits["eval"])
    keys = [r.key for rows in splits.values() for r in rows]
    if len(set(keys)) != len(keys):  # a memory unit with two pairs for one slot would collide
        dup = next(k for k, n in Counter(keys).items() if n > 1)
        raise TodDataError(f"{tod_dir}: memory holds two QA pairs for one slot of one session ({dup})")
    for name, rows in splits.items():  # checked before anything is written: a trainer given no pairs fails later
        if not rows:
            ids = train_ids if name == "train" else eval_ids
            raise NothingDoneError(
                f"data judger: no {name} pairs: its {len(ids)} individual(s) have no confirming session with memory "
                "before it; no dataset written"
            )
    out = Path(out)
    for name, rows in splits.items():
        write_pairs(rows, out / name / "pairs.jsonl")
    stats = {
        "tod_dir": str(tod_dir),
        "seed": seed,
        "individuals": {"train": train_ids, "eval": eval_ids},
        **{name: split_stats(rows) for name, rows in splits.items()},
        "memory": {
            "writer": cfg.memory_writer or "text",
            "writer_failures": builder.failures,
            **memory_coverage(individuals, banks),
        },
        "problems": (problems or LoadProblems()).summary(),
    }
    atomic_write_json(out / "stats.json", stats)
    return stats
