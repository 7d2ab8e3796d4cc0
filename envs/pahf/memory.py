"""Per-user note memory for PAHF: one API, a SQLite note store and a FAISS index, identical retrieval semantics.

A note is a short text and the unit-norm float32 embedding of that text. The score of a note for a query is the
cosine of the two embeddings, computed in float64 from the stored float32 vectors and rounded to `SCORE_DECIMALS`,
and results are ordered by score (best first), then note id (oldest first). Both backends produce the same ids,
scores and order: SQLite scores every note of the user on each query; FAISS asks its float32 index for candidates
with a safety margin wide enough to contain every note that float32 rounding could have misplaced, then rescores
those candidates the same way SQLite does. Users never see each other's notes. Note ids are global and increase
from 1, so the same sequence of adds gives the same ids in both backends.
"""

from __future__ import annotations

import builtins
import json
import operator
import sqlite3
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from memrl.core.errors import MemrlError, closest, first_line
from memrl.core.files import atomic_write_json

SCORE_DECIMALS = 9  # far below float32 noise, far above float64 noise: equal vectors tie whatever the BLAS order
MEMORY_KINDS: tuple[str, ...] = ("sqlite", "faiss")
_IN_BATCH = 500  # ids per `IN (...)` query, under SQLite's bound on bound parameters
# Below this many vectors a one-query FAISS search runs on one thread: the scan is memory-bound, and waking
# OpenMP workers on a busy machine cost more than they save (measured on 2 cores: 10x slower at 1e4 and 3x at 1e5).
_FAISS_PARALLEL_FROM = 1_000_000

S = TypeVar("S", bound="_Store")


@dataclass(frozen=True)
class Note:
    id: int
    user: str
    text: str


class TextEmbedder(Protocol):
    """Anything that turns texts into a (len(texts), dim) matrix, e.g. `memrl.rollout.embedding.Embedder`."""

    def encode(self, texts: list[str]) -> np.ndarray: ...


class MemoryStore(Protocol):
    def add(self, user: str, text: str) -> int:
        """Store a new note for `user`; its id."""
        ...

    def search(self, user: str, query: str, k: int = 5) -> builtins.list[tuple[Note, float]]:
        """The user's `k` notes closest to `query` (fewer if the user has fewer), with cosine scores, best first."""
        ...

    def most_similar(self, user: str, text: str, threshold: float) -> tuple[Note, float] | None:
        """The user's closest note if its score is at least `threshold`, else None ("update vs. add")."""
        ...

    def update(self, user: str, note_id: int, text: str) -> None:
        """Replace a note's text and embedding; its id stays."""
        ...

    def get(self, user: str, note_id: int) -> Note: ...

    def list(self, user: str) -> builtins.list[Note]:
        """The user's notes, oldest first."""
        ...

    def save(self) -> None:
        """Make what is in memory durable under the store's path (a no-op where each write already is)."""
        ...

    def close(self) -> None: ...


def default_embedder() -> TextEmbedder:
    """The process-wide MiniLM embedder."""
    from memrl.rollout.embedding import get_embedder

    return get_embedder()


def rank(ids: np.ndarray, vectors: np.ndarray, query: np.ndarray, k: int) -> builtins.list[tuple[int, float]]:
    """The `k` best (id, score) pairs: score = float64 dot of unit float32 vectors, by score desc then id asc."""
    if len(ids) == 0:
        return []
    scores = np.round(vectors.astype(np.float64) @ query.astype(np.float64), SCORE_DECIMALS)
    if len(scores) > k:
        # Keep every note scoring at least the k-th best, so ties at the boundary are settled by id below.
        kth = np.partition(scores, len(scores) - k)[len(scores) - k]
        keep = scores >= kth
        ids, scores = ids[keep], scores[keep]
    order = np.lexsort((ids, -scores))[:k]
    return [(int(ids[i]), float(scores[i])) for i in order]


class _Store(ABC):
    """What both backends share: embedding, argument checks, the closed flag, a lock."""

    def __init__(self, embedder: TextEmbedder | None, where: str) -> None:
        self.embedder = embedder if embedder is not None else default_embedder()
        self.where = where  # names the store in error messages
        self._dim: int | None = None
        self._closed = False
        self._lock = threading.RLock()  # sqlite3 and faiss objects are not safe to share across threads

    def _embed(self, texts: builtins.list[str]) -> np.ndarray:
        """(len(texts), dim) unit-norm float32; zero vectors stay zero (cosine 0 with everything)."""
        try:
            raw = np.asarray(self.embedder.encode(texts), dtype=np.float64)
        except MemrlError:
            raise
        except Exception as exc:
            raise MemrlError(f"{self.where}: the embedder failed: {first_line(exc)}") from exc
        if raw.ndim != 2 or raw.shape[0] != len(texts) or raw.shape[1] == 0:
            raise MemrlError(f"{self.where}: embedder returned shape {raw.shape} for {len(texts)} texts")
        if not np.isfinite(raw).all():
            raise MemrlError(f"{self.where}: embedder returned non-finite values")
        if self._dim is None:
            self._dim = raw.shape[1]
        elif raw.shape[1] != self._dim:
            raise MemrlError(f"{self.where}: embedder gives dim {raw.shape[1]}, stored notes have dim {self._dim}")
        norms = np.linalg.norm(raw, axis=1, keepdims=True)
        return (raw / np.where(norms > 0, norms, 1.0)).astype(np.float32)

    def _check(self, user: str, text: str | None = None) -> None:
        if self._closed:
            raise MemrlError(f"{self.where}: memory store is closed")
        if not isinstance(user, str) or not user:
            raise MemrlError(f"{self.where}: user must be a non-empty string, got {user!r}")
        if text is not None and (not isinstance(text, str) or not text.strip()):
            raise MemrlError(f"{self.where}: note text must be a non-empty string, got {text!r}")

    @staticmethod
    def _check_k(k: int) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise MemrlError(f"search k must be a positive integer, got {k!r}")

    def _note_id(self, note_id: int) -> int:
        try:
            if isinstance(note_id, bool):
                raise TypeError
            return operator.index(note_id)
        except TypeError:
            raise MemrlError(f"{self.where}: note id must be an integer, got {note_id!r}") from None

    def _missing(self, user: str, note_id: int) -> MemrlError:
        return MemrlError(f"{self.where}: no note {note_id} for user {user!r}")

    def add(self, user: str, text: str) -> int:
        return self.add_many(user, [text])[0]

    def add_many(self, user: str, texts: builtins.list[str]) -> builtins.list[int]:
        """Store several notes with one embedder call; their ids in order."""
        with self._lock:
            for text in texts:
                self._check(user, text)
            return self._store(user, texts, self._embed(texts)) if texts else []

    @abstractmethod
    def _store(self, user: str, texts: builtins.list[str], vectors: np.ndarray) -> builtins.list[int]:
        """Persist checked notes with their unit-norm vectors; their ids in order."""

    def most_similar(self, user: str, text: str, threshold: float) -> tuple[Note, float] | None:
        best = self.search(user, text, k=1)
        return best[0] if best and best[0][1] >= threshold else None

    @abstractmethod
    def search(self, user: str, query: str, k: int = 5) -> builtins.list[tuple[Note, float]]: ...

    def close(self) -> None:
        self._closed = True

    def __enter__(self: S) -> S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SQLiteMemory(_Store):
    """Notes in one SQLite table with their embeddings as float32 blobs; every search scores all the user's notes.

    `path=None` keeps the database in memory. Each write is committed, so reopening the file gives the same notes.
    """

    _CHUNK = 4096  # rows read per fetch: bounds memory on large stores

    def __init__(self, path: str | Path | None, embedder: TextEmbedder | None = None) -> None:
        super().__init__(embedder, str(path) if path is not None else "sqlite memory")
        self.path = Path(path) if path is not None else None
        try:
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(str(self.path) if self.path else ":memory:", check_same_thread=False)
            # WAL with synchronous=NORMAL: a write costs no fsync of its own, and a crashed process loses nothing.
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            with self._conn:
                self._conn.execute(
                    "CREATE TABLE IF NOT EXISTS notes (id INTEGER PRIMARY KEY AUTOINCREMENT, user TEXT NOT NULL, "
                    "text TEXT NOT NULL, dim INTEGER NOT NULL, embedding BLOB NOT NULL)"
                )
                self._conn.execute("CREATE INDEX IF NOT EXISTS notes_user ON notes (user, id)")
            row = self._conn.execute("SELECT dim FROM notes LIMIT 1").fetchone()
        except (sqlite3.Error, OSError) as exc:
            raise MemrlError(f"{self.where}: cannot open the SQLite memory: {first_line(exc)}") from exc
        self._dim = int(row[0]) if row else None

    def _sql(self, query: str, params: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        try:
            with self._conn:
                return self._conn.execute(query, params)
        except sqlite3.Error as exc:
            raise MemrlError(f"{self.where}: SQLite error: {first_line(exc)}") from exc

    def _store(self, user: str, texts: builtins.list[str], vectors: np.ndarray) -> builtins.list[int]:
        ids = []
        try:
            with self._conn:  # one transaction
                for text, vector in zip(texts, vectors, strict=True):
                    cur = self._conn.execute(
                        "INSERT INTO notes (user, text, dim, embedding) VALUES (?, ?, ?, ?)",
                        (user, text, len(vector), vector.tobytes()),
                    )
                    ids.append(int(cur.lastrowid or 0))
        except sqlite3.Error as exc:
            raise MemrlError(f"{self.where}: SQLite error: {first_line(exc)}") from exc
        return ids

    def search(self, user: str, query: str, k: int = 5) -> builtins.list[tuple[Note, float]]:
        with self._lock:
            self._check(user, query)
            self._check_k(k)
            if self._sql("SELECT 1 FROM notes WHERE user = ? LIMIT 1", (user,)).fetchone() is None:
                return []
            q = self._embed([query])[0]
            cur = self._sql("SELECT id, embedding FROM notes WHERE user = ? ORDER BY id", (user,))
            best: builtins.list[tuple[int, float]] = []
            while rows := cur.fetchmany(self._CHUNK):
                ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
                blob = b"".join(r[1] for r in rows)
                if len(blob) != len(rows) * len(q) * 4:
                    raise MemrlError(f"{self.where}: stored embeddings of user {user!r} do not have dim {len(q)}")
                vectors = np.frombuffer(blob, dtype=np.float32).reshape(len(rows), len(q))
                # Merging per-chunk top-k lists gives the global top-k: scores do not depend on the chunk.
                best = rank_pairs([*best, *rank(ids, vectors, q, k)], k)
            texts: dict[int, str] = {}
            for start in range(0, len(best), _IN_BATCH):
                batch = tuple(i for i, _ in best[start : start + _IN_BATCH])
                marks = ",".join("?" * len(batch))
                texts.update(self._sql(f"SELECT id, text FROM notes WHERE id IN ({marks})", batch).fetchall())
            return [(Note(i, user, texts[i]), score) for i, score in best]

    def update(self, user: str, note_id: int, text: str) -> None:
        with self._lock:
            self._check(user, text)
            note_id = self.get(user, note_id).id
            vector = self._embed([text])[0]
            self._sql(
                "UPDATE notes SET text = ?, dim = ?, embedding = ? WHERE id = ? AND user = ?",
                (text, len(vector), vector.tobytes(), note_id, user),
            )

    def get(self, user: str, note_id: int) -> Note:
        with self._lock:
            self._check(user)
            note_id = self._note_id(note_id)
            row = self._sql("SELECT text FROM notes WHERE id = ? AND user = ?", (note_id, user)).fetchone()
            if row is None:
                raise self._missing(user, note_id)
            return Note(note_id, user, row[0])

    def list(self, user: str) -> builtins.list[Note]:
        with self._lock:
            self._check(user)
            rows = self._sql("SELECT id, text FROM notes WHERE user = ? ORDER BY id", (user,)).fetchall()
            return [Note(int(i), user, t) for i, t in rows]

    def save(self) -> None:
        """Nothing to do: every write is committed as it happens."""

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._conn.close()
            super().close()


def rank_pairs(pairs: builtins.list[tuple[int, float]], k: int) -> builtins.list[tuple[int, float]]:
    """(id, score) pairs in the order `rank` uses, cut to `k`."""
    return sorted(pairs, key=lambda p: (-p[1], p[0]))[:k]


class FaissMemory(_Store):
    """One `IndexIDMap2(IndexFlatIP)` per user over unit vectors (so inner product = cosine), in memory.

    With a `path` (a directory), the constructor loads what `save()` wrote there, and `close()` saves.
    """

    def __init__(self, embedder: TextEmbedder | None = None, path: str | Path | None = None) -> None:
        super().__init__(embedder, str(path) if path is not None else "faiss memory")
        self.path = Path(path) if path is not None else None
        self._reset()
        if self.path is not None and (self.path / "meta.json").exists():
            self.load()

    def _reset(self) -> None:
        self._notes: dict[int, Note] = {}
        self._indexes: dict[str, Any] = {}  # user -> faiss.IndexIDMap2
        self._next_id = 1
        self._dim = None

    def _index(self, user: str, dim: int) -> Any:
        import faiss

        if user not in self._indexes:
            self._indexes[user] = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
        return self._indexes[user]

    def _store(self, user: str, texts: builtins.list[str], vectors: np.ndarray) -> builtins.list[int]:
        ids = list(range(self._next_id, self._next_id + len(texts)))
        self._index(user, vectors.shape[1]).add_with_ids(vectors, np.asarray(ids, dtype=np.int64))
        for note_id, text in zip(ids, texts, strict=True):
            self._notes[note_id] = Note(note_id, user, text)
        self._next_id += len(texts)
        return ids

    def search(self, user: str, query: str, k: int = 5) -> builtins.list[tuple[Note, float]]:
        with self._lock:
            self._check(user, query)
            self._check_k(k)
            index = self._indexes.get(user)
            if index is None or index.ntotal == 0:
                return []
            q = self._embed([query])
            candidates = self._candidates(index, q, k)
            vectors = index.reconstruct_batch(candidates)
            return [(self._notes[i], score) for i, score in rank(candidates, vectors, q[0], k)]

    @staticmethod
    def _candidates(index: Any, q: np.ndarray, k: int) -> np.ndarray:
        """Ids that surely contain the exact top-k (ties included) despite float32 rounding inside FAISS.

        A float32 dot of unit vectors is within d * 2^-24 of the exact one; a note left out has a FAISS score at
        most the last one returned, so it cannot reach the k-th best exact score once the last returned score
        lies more than twice that bound (plus the rounding of scores) below the k-th returned one.
        """
        total, dim = index.ntotal, q.shape[1]
        margin = 2 * (1.01 * dim * 2.0**-24) + 2 * 10.0**-SCORE_DECIMALS
        fetch = min(total, 2 * k + 8)
        while True:
            with _faiss_threads(1 if total < _FAISS_PARALLEL_FROM else None):
                scores, ids = index.search(q, fetch)
            if fetch == total or scores[0, fetch - 1] < scores[0, min(k, fetch) - 1] - margin:
                return np.asarray(ids[0], dtype=np.int64)
            fetch = min(total, 2 * fetch)

    def update(self, user: str, note_id: int, text: str) -> None:
        with self._lock:
            self._check(user, text)
            note_id = self.get(user, note_id).id
            vector = self._embed([text])
            index = self._indexes[user]
            key = np.asarray([note_id], dtype=np.int64)
            index.remove_ids(key)
            index.add_with_ids(vector, key)
            self._notes[note_id] = Note(note_id, user, text)

    def get(self, user: str, note_id: int) -> Note:
        with self._lock:
            self._check(user)
            note_id = self._note_id(note_id)
            note = self._notes.get(note_id)
            if note is None or note.user != user:
                raise self._missing(user, note_id)
            return note

    def list(self, user: str) -> builtins.list[Note]:
        with self._lock:
            self._check(user)
            return sorted((n for n in self._notes.values() if n.user == user), key=lambda n: n.id)

    def _folder(self, verb: str) -> Path:
        if self._closed:
            raise MemrlError(f"{self.where}: memory store is closed")
        if self.path is None:
            raise MemrlError(f"faiss memory: no path to {verb} (construct it with path=...)")
        return self.path

    def save(self) -> None:
        """Write the notes (`meta.json`) and one index file per user under `path`; meta last, so it is complete."""
        import faiss

        with self._lock:
            path = self._folder("save to")
            files = {user: f"user-{n}.faiss" for n, user in enumerate(sorted(self._indexes))}
            meta = {
                "version": 1,
                "dim": self._dim,
                "next_id": self._next_id,
                "users": files,
                "notes": [[n.id, n.user, n.text] for n in sorted(self._notes.values(), key=lambda n: n.id)],
            }
            try:
                path.mkdir(parents=True, exist_ok=True)
                for user, name in files.items():
                    faiss.write_index(self._indexes[user], str(path / name))
                atomic_write_json(path / "meta.json", meta, indent=None)
            except (OSError, RuntimeError) as exc:
                raise MemrlError(f"{self.where}: cannot save the FAISS memory: {first_line(exc)}") from exc

    def load(self) -> None:
        """Replace the in-memory notes and indexes with what `save()` wrote under `path`."""
        import faiss

        with self._lock:
            path = self._folder("load from")
            meta_path = path / "meta.json"
            try:
                meta = json.loads(meta_path.read_text())
                indexes = {user: faiss.read_index(str(path / name)) for user, name in meta["users"].items()}
                notes = {int(i): Note(int(i), str(u), str(t)) for i, u, t in meta["notes"]}
                next_id, dim = int(meta["next_id"]), meta["dim"]
            except (OSError, RuntimeError, ValueError, KeyError, TypeError) as exc:
                raise MemrlError(f"{meta_path}: cannot load the FAISS memory: {first_line(exc)}") from exc
            for user, index in indexes.items():
                if index.ntotal != sum(n.user == user for n in notes.values()):
                    raise MemrlError(f"{meta_path}: index of user {user!r} does not match its notes")
            self._reset()
            self._indexes, self._notes, self._next_id = indexes, notes, next_id
            self._dim = int(dim) if dim is not None else None

    def close(self) -> None:
        with self._lock:
            if not self._closed and self.path is not None:
                self.save()
            super().close()


@contextmanager
def _faiss_threads(threads: int | None) -> Iterator[None]:
    """FAISS's OpenMP thread count for this thread, for the duration (None: leave it).

    faiss-cpu ships its own OpenMP runtime and the setting is per calling thread, so torch and other threads are
    unaffected.
    """
    if threads is None:
        yield
        return
    import faiss

    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(threads)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


_BUILDERS: dict[str, Callable[[Path | None, TextEmbedder | None], MemoryStore]] = {
    "sqlite": lambda path, embedder: SQLiteMemory(path, embedder),
    "faiss": lambda path, embedder: FaissMemory(embedder, path),
}


def build_memory(kind: str, path: str | Path | None = None, embedder: TextEmbedder | None = None) -> MemoryStore:
    """A memory store of `kind` ("sqlite" or "faiss") at `path` (None: in memory); MiniLM unless `embedder`."""
    builder = _BUILDERS.get(kind)
    if builder is None:
        hint = closest(kind, _BUILDERS)
        raise MemrlError(
            f"unknown memory {kind!r}; expected one of {', '.join(MEMORY_KINDS)}"
            + (f" (did you mean {hint!r}?)" if hint else "")
        )
    return builder(Path(path) if path is not None else None, embedder)
