"""Retrieval latency of the PAHF memory backends (SQLite note store vs FAISS index) as the store grows.

One user holds 1e3, then 1e4, then 1e5 notes (the stores grow in place); at each size both backends answer the
same top-k queries and must return the same notes. Embeddings are random unit vectors (dim 384, like MiniLM)
from a fake embedder that looks them up by text, so the numbers are retrieval alone, not MiniLM's encoding time.
Reports the median per-query latency, the ratio SQLite/FAISS at each size, and each backend's growth per 10x notes.

    OMP_NUM_THREADS=2 python benchmarks/pahf_memory.py [--sizes 1000 10000 100000] [--queries 30] [--out DIR]
    OMP_NUM_THREADS=2 python benchmarks/pahf_memory.py --quick   # 1e3 and 1e4 notes, 10 queries: a few seconds
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from memrl.envs.pahf.memory import FaissMemory, SQLiteMemory

HERE = Path(__file__).parent


class LookupEmbedder:
    """Texts are "n<i>" (note i) or "q<j>" (query j); each maps to a fixed random unit vector."""

    def __init__(self, notes: int, queries: int, dim: int = 384, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.notes = _unit(rng.standard_normal((notes, dim), dtype=np.float32))
        self.queries = _unit(rng.standard_normal((queries, dim), dtype=np.float32))

    def encode(self, texts: list[str]) -> np.ndarray:
        table = {"n": self.notes, "q": self.queries}
        return np.stack([table[t[0]][int(t[1:])] for t in texts]) if texts else np.zeros((0, 384), np.float32)


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _latency(store: SQLiteMemory | FaissMemory, queries: list[str], k: int) -> tuple[float, list[list[int]]]:
    """Median seconds per query (after one warm-up query) and the ids each query returned."""
    store.search("bench", queries[0], k)
    times, ids = [], []
    for query in queries:
        start = time.perf_counter()
        hits = store.search("bench", query, k)
        times.append(time.perf_counter() - start)
        ids.append([note.id for note, _ in hits])
    return statistics.median(times), ids


def run(sizes: list[int], queries: int, k: int, workdir: Path) -> list[dict[str, float]]:
    embedder = LookupEmbedder(max(sizes), queries)
    sqlite = SQLiteMemory(workdir / "notes.sqlite", embedder)
    faiss = FaissMemory(embedder)
    texts = [f"q{j}" for j in range(queries)]
    rows: list[dict[str, float]] = []
    held = 0
    for size in sorted(sizes):
        batch = [f"n{i}" for i in range(held, size)]
        for start in range(0, len(batch), 10_000):
            assert sqlite.add_many("bench", batch[start : start + 10_000]) == faiss.add_many(
                "bench", batch[start : start + 10_000]
            )
        held = size
        sqlite_s, sqlite_ids = _latency(sqlite, texts, k)
        faiss_s, faiss_ids = _latency(faiss, texts, k)
        if sqlite_ids != faiss_ids:
            raise SystemExit(f"backends disagree at {size} notes")
        rows.append({"notes": size, "sqlite_ms": sqlite_s * 1e3, "faiss_ms": faiss_s * 1e3})
        print(f"{size} notes: sqlite {sqlite_s * 1e3:.3f} ms, faiss {faiss_s * 1e3:.3f} ms", flush=True)
    sqlite.close()
    faiss.close()
    for prev, row in zip([None, *rows], rows, strict=False):
        row["ratio"] = row["sqlite_ms"] / row["faiss_ms"]
        if prev is not None:
            per_10x = np.log10(row["notes"] / prev["notes"])  # growth per 10x notes, whatever the size step
            row["sqlite_growth"] = (row["sqlite_ms"] / prev["sqlite_ms"]) ** (1 / per_10x)
            row["faiss_growth"] = (row["faiss_ms"] / prev["faiss_ms"]) ** (1 / per_10x)
    return rows


def table(rows: list[dict[str, float]]) -> str:
    lines = [
        "| notes | SQLite ms/query | FAISS ms/query | SQLite/FAISS | SQLite growth per 10x | FAISS growth per 10x |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        growth = [f"{r[key]:.1f}x" if key in r else "-" for key in ("sqlite_growth", "faiss_growth")]
        lines.append(
            f"| {int(r['notes']):,} | {r['sqlite_ms']:.3f} | {r['faiss_ms']:.3f} | {r['ratio']:.0f}x | "
            f"{growth[0]} | {growth[1]} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--queries", type=int, default=30, help="queries timed at each size (median reported)")
    parser.add_argument("-k", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="sizes 1000 10000 and 10 queries (overrides both)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.queries = [1_000, 10_000], 10
    with tempfile.TemporaryDirectory(prefix="pahf-memory-") as tmp:
        rows = run(args.sizes, args.queries, args.k, Path(tmp))
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "rows": rows,
        "k": args.k,
        "queries": args.queries,
        "dim": 384,
        "machine": {"cpus": os.cpu_count(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
    }
    (args.out / "pahf_memory.json").write_text(json.dumps(result, indent=2) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
