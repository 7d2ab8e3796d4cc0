"""PAHF memory: the SQLite and FAISS backends agree on retrieval, isolate users, persist, and fail in one line."""

from __future__ import annotations

import hashlib
import itertools
import random
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from memrl.core.errors import MemrlError
from memrl.envs.pahf.memory import FaissMemory, MemoryStore, Note, SQLiteMemory, build_memory

WORDS = ("red", "blue", "green", "shoes", "shirt", "cotton", "wool", "cheap", "brand", "quiet", "loud", "mug", "cup")


class BagOfWords:
    """Hashed word counts: discrete scores, so ties (and exact duplicates) are common."""

    def __init__(self, dim: int = 16) -> None:
        self.dim = dim

    def encode(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                out[row, int(hashlib.md5(word.encode()).hexdigest(), 16) % self.dim] += 1.0
        return out


class HashedGaussian:
    """A random unit-free vector per text, seeded by its hash: continuous scores with near-ties."""

    def __init__(self, dim: int = 48) -> None:
        self.dim = dim

    def encode(self, texts: list[str]) -> np.ndarray:
        seeds = [int(hashlib.md5(t.encode()).hexdigest()[:8], 16) for t in texts]
        return np.stack([np.random.default_rng(s).standard_normal(self.dim) for s in seeds]).astype(np.float32)


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4)))


def _stores(tmp_path: Path, embedder: object) -> tuple[SQLiteMemory, FaissMemory]:
    return SQLiteMemory(tmp_path / "notes.sqlite", embedder), FaissMemory(embedder)  # type: ignore[arg-type]


def _view(hits: list[tuple[Note, float]]) -> list[tuple[int, str, str]]:
    return [(n.id, n.user, n.text) for n, _ in hits]


def _assert_same(a: list[tuple[Note, float]], b: list[tuple[Note, float]]) -> None:
    assert _view(a) == _view(b)
    np.testing.assert_allclose([s for _, s in a], [s for _, s in b], atol=1e-5)
    scores = [s for _, s in a]
    assert scores == sorted(scores, reverse=True)
    for (n1, s1), (n2, s2) in itertools.pairwise(a):
        assert s1 > s2 or n1.id < n2.id  # ties: oldest note first


@pytest.mark.parametrize("embedder", [BagOfWords(), HashedGaussian()], ids=["bag-of-words", "gaussian"])
def test_backends_agree_on_a_random_workload(tmp_path: Path, embedder: object) -> None:
    rng = random.Random(6)
    sqlite, faiss = _stores(tmp_path, embedder)
    users = ["ann", "bob", "cy", "dee"]
    owned: dict[str, list[int]] = {u: [] for u in users}
    searches = 0
    for _ in range(1500):
        user, roll = rng.choice(users), rng.random()
        if roll < 0.5 or not owned[user]:
            text = _sentence(rng)
            note_id = sqlite.add(user, text)
            assert faiss.add(user, text) == note_id
            owned[user].append(note_id)
        elif roll < 0.65:
            note_id, text = rng.choice(owned[user]), _sentence(rng)
            sqlite.update(user, note_id, text)
            faiss.update(user, note_id, text)
        else:
            query, k = _sentence(rng), rng.choice([1, 2, 3, 5, 10, 500])
            hits = sqlite.search(user, query, k)
            _assert_same(hits, faiss.search(user, query, k))
            assert len(hits) == min(k, len(owned[user]))
            assert all(n.user == user for n, _ in hits)
            threshold = rng.choice([0.0, 0.5, 0.8, 1.0 - 1e-6])
            assert sqlite.most_similar(user, query, threshold) == faiss.most_similar(user, query, threshold)
            searches += 1
    assert searches > 300
    for user in users:
        assert sqlite.list(user) == faiss.list(user)
        assert [n.id for n in sqlite.list(user)] == sorted(owned[user])


def test_backends_agree_with_minilm(tmp_path: Path) -> None:
    from memrl.rollout.embedding import get_embedder

    embedder = get_embedder()
    notes = [
        "Prefers running shoes in bright red.",
        "Dislikes wool sweaters; they itch.",
        "Keeps coffee mugs on the top kitchen shelf.",
        "Wants the cheapest option when the brand does not matter.",
    ]
    sqlite, faiss = _stores(tmp_path, embedder)
    for text in notes:
        sqlite.add("u", text)
        faiss.add("u", text)
    for query in ["which shoes should I buy?", "where do the mugs go", "a warm sweater"]:
        _assert_same(sqlite.search("u", query, 3), faiss.search("u", query, 3))
    best, score = sqlite.search("u", "put the coffee cup away", 1)[0]
    assert best.text == notes[2]
    assert 0.3 < score <= 1.0


@pytest.mark.parametrize("kind", ["sqlite", "faiss"])
def test_most_similar_threshold(tmp_path: Path, kind: str) -> None:
    store = build_memory(kind, tmp_path / "m", BagOfWords())
    assert store.most_similar("u", "red shoes", 0.0) is None  # no notes yet
    note_id = store.add("u", "red shoes")
    store.add("u", "blue mug")
    hit = store.most_similar("u", "red shoes", 0.99)
    assert hit is not None and hit[0].id == note_id and hit[1] == pytest.approx(1.0, abs=1e-6)
    _, score = store.search("u", "red shirt", 1)[0]
    assert store.most_similar("u", "red shirt", score) == (store.get("u", note_id), score)  # at the threshold
    assert store.most_similar("u", "red shirt", score + 1e-6) is None
    assert store.most_similar("u", "kitchen table", 0.1) is None  # nothing related


@pytest.mark.parametrize("kind", ["sqlite", "faiss"])
def test_update_in_place_changes_retrieval(tmp_path: Path, kind: str) -> None:
    store = build_memory(kind, tmp_path / "m", BagOfWords())
    first = store.add("u", "red shoes")
    second = store.add("u", "blue shirt")
    assert store.search("u", "green cotton", 1)[0][1] == 0.0
    store.update("u", first, "green cotton shoes")
    assert store.get("u", first) == Note(first, "u", "green cotton shoes")
    assert [n.id for n in store.list("u")] == [first, second]
    assert store.search("u", "green cotton", 1)[0][0].id == first
    assert store.search("u", "red", 2)[0][1] == 0.0  # the old text is gone from the index too


@pytest.mark.parametrize("kind", ["sqlite", "faiss"])
def test_users_are_isolated(tmp_path: Path, kind: str) -> None:
    store = build_memory(kind, tmp_path / "m", BagOfWords())
    mine = store.add("ann", "red shoes")
    store.add("bob", "blue mug")
    assert _view(store.search("bob", "red shoes", 10)) == [(2, "bob", "blue mug")]
    assert store.search("cy", "red shoes", 10) == []
    assert store.list("cy") == []
    with pytest.raises(MemrlError, match="no note 1 for user 'bob'"):
        store.get("bob", mine)
    with pytest.raises(MemrlError, match="no note 1 for user 'bob'"):
        store.update("bob", mine, "stolen")
    assert store.get("ann", mine).text == "red shoes"


def test_sqlite_persists_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "notes.sqlite"
    store = SQLiteMemory(path, BagOfWords())
    store.add("u", "red shoes")
    store.add("u", "blue mug")
    store.update("u", 1, "green shoes")
    before, hits = store.list("u"), store.search("u", "green", 2)
    store.close()
    with SQLiteMemory(path, BagOfWords()) as again:
        assert again.list("u") == before
        assert again.search("u", "green", 2) == hits
        assert again.add("u", "cotton shirt") == 3


def test_faiss_save_load_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "faiss"
    store = FaissMemory(HashedGaussian(), path)
    for n in range(20):
        store.add(f"user{n % 3}", f"note {n}")
    store.update("user1", 2, "changed")
    store.save()
    hits = {u: store.search(u, "note 5", 4) for u in ("user0", "user1", "user2")}
    store.add("user0", "not saved")
    store.load()
    assert len(store.list("user0")) == 7
    store.close()  # saves
    again = FaissMemory(HashedGaussian(), path)
    assert again.get("user1", 2).text == "changed"
    assert {u: again.search(u, "note 5", 4) for u in hits} == hits
    assert again.add("user0", "next") == 21  # ids continue after a reload


def _fails(match: str, call: Callable[[], object]) -> None:
    """`call` raises a one-line MemrlError matching `match`."""
    with pytest.raises(MemrlError, match=match) as caught:
        call()
    assert "\n" not in str(caught.value)


def test_bad_input_errors(tmp_path: Path) -> None:
    store: MemoryStore = SQLiteMemory(None, BagOfWords())
    _fails("k must be a positive integer", lambda: store.search("u", "red", 0))
    _fails("note text must be a non-empty string", lambda: store.add("u", "  "))
    _fails("note id must be an integer", lambda: store.get("u", "1"))  # type: ignore[arg-type]
    _fails("user must be a non-empty string", lambda: store.list(""))
    store.close()
    store.close()  # twice is fine
    _fails("memory store is closed", lambda: store.add("u", "red"))
    _fails("cannot open the SQLite memory", lambda: SQLiteMemory(tmp_path, BagOfWords()))  # a directory
    (bogus := tmp_path / "bogus.sqlite").write_text("not a database, " * 100)
    _fails("bogus.sqlite: cannot open the SQLite memory", lambda: SQLiteMemory(bogus, BagOfWords()))
    _fails(r"unknown memory 'sqlit'.*did you mean 'sqlite'", lambda: build_memory("sqlit", None, BagOfWords()))
    _fails("no path to save to", lambda: FaissMemory(BagOfWords()).save())
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "meta.json").write_text("{")
    _fails("meta.json: cannot load the FAISS memory", lambda: FaissMemory(BagOfWords(), tmp_path / "broken"))
    mixed = SQLiteMemory(tmp_path / "mixed.sqlite", BagOfWords(16))
    mixed.add("u", "red")
    mixed.close()
    reopened = SQLiteMemory(tmp_path / "mixed.sqlite", BagOfWords(8))
    _fails("embedder gives dim 8, stored notes have dim 16", lambda: reopened.search("u", "red"))
    faiss = FaissMemory(BagOfWords())
    faiss.add("u", "red")
    faiss.close()
    _fails("memory store is closed", lambda: faiss.search("u", "red"))
