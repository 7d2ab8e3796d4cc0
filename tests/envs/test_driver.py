"""The shared environment driver (`envs.driver`) on a tiny in-process world: chains, resume, failures, duplicates."""

from __future__ import annotations

import io
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from support import local_ray

from memrl.core.errors import MemrlError
from memrl.envs.driver import Chain, Schedule, World, drive, resume
from memrl.rollout.config import ModelConfig

RECORDS = "records.jsonl"


@dataclass(frozen=True)
class Spread:
    workers: int | None = 2
    max_in_flight: int = 4
    ray_address: str | None = None


@dataclass(frozen=True)
class Roles:
    model: ModelConfig | None = None  # none needed: nothing is served


@dataclass(frozen=True)
class Item:
    chain: str
    index: int

    @property
    def key(self) -> str:
        return f"{self.chain}/{self.index}"


class Adder:
    """Item i of a chain adds i + 1 to the chain's running total; the keys in `fail` fail as an endpoint would."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.fail = set(spec["fail"])
        self.run_id = spec["run"]

    def run(self, key: str, index: int, total: int) -> dict[str, Any]:
        import ray

        if key in self.fail:
            return {"key": key, "status": "failed", "error": "endpoint down"}
        actor = ray.get_runtime_context().get_actor_id()
        return {
            "key": key,
            "index": index,
            "got": total,
            "total": total + index + 1,
            "run": self.run_id,
            "actor": actor,
        }


def schedule(**kw: Any) -> Schedule[Item, int]:
    return Schedule(
        key=lambda item: item.key,
        name=lambda item: f"item {item.key}",
        args=lambda item, total: (item.key, item.index, total),
        advance=lambda _, record: int(record["total"]),
        **kw,
    )


def chains(n: int, length: int) -> list[Chain[Item, int]]:
    return [Chain(c, [Item(c, i) for i in range(length)], 0) for c in "abcdefgh"[:n]]


def world(run: int = 0, fail: tuple[str, ...] = ()) -> World[Roles]:
    return World(Adder, Roles(), lambda roles: {"fail": fail, "run": run})


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def ray_up() -> Iterator[None]:
    import ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers need not import the tests folder
    with local_ray(num_cpus=2):  # one local Ray for the module: `drive` joins it
        yield


# --- without Ray --------------------------------------------------------------------------------------------------


def test_resume_skips_finished_items_and_folds_their_state() -> None:
    done = {"a/0": {"total": 1}, "a/1": {"total": 3}, "b/1": {"total": 40}}
    left = resume(chains(3, 3), schedule(), done)
    assert [[i.key for i in c.items] for c in left] == [["a/2"], ["b/0", "b/2"], ["c/0", "c/1", "c/2"]]
    assert [c.state for c in left] == [3, 40, 0]  # the state the last finished item left (b: one out of order)
    assert resume(chains(1, 2), schedule(), {"a/0": {"total": 1}, "a/1": {"total": 3}}) == []


def test_nothing_left_starts_neither_servers_nor_ray(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import memrl.envs.driver as driver

    def refuse(*_: Any) -> None:
        raise AssertionError("nothing to run: Ray must not start")

    monkeypatch.setattr(driver, "start_ray", refuse)
    monkeypatch.setattr(driver, "serve_roles", refuse)
    (tmp_path / RECORDS).write_text("".join(json.dumps({"key": k, "total": 0}) + "\n" for k in ["a/0", "a/1", "x"]))
    run = drive(Spread(), tmp_path, Console(file=io.StringIO()), records=RECORDS, label="items",
                chains=chains(1, 2), schedule=schedule(), world=world())  # fmt: skip
    assert [r["key"] for r in run.records] == ["a/0", "a/1", "x"] and run.planned == 2


def test_a_key_written_twice_counts_once(tmp_path: Path) -> None:
    # Two runs into one folder (before folders were held) left every record twice: nothing is pending, nothing is run.
    twice = [{"key": k, "total": t} for k, t in [("a/0", 1), ("a/1", 3)] * 2]
    (tmp_path / RECORDS).write_text("".join(json.dumps(r) + "\n" for r in twice))
    run = drive(Spread(), tmp_path, Console(file=io.StringIO()), records=RECORDS, label="items",
                chains=chains(1, 2), schedule=schedule(), world=world())  # fmt: skip
    assert [r["key"] for r in run.records] == ["a/0", "a/1"] and run.pending == 0 and run.fault is None


def test_records_come_back_in_the_plans_order_not_the_files(tmp_path: Path) -> None:
    # Sessions land in the file as they finish, which depends on timing; a dataset built from the run must not.
    done = [{"key": k, "total": 0} for k in ["b/1", "a/0", "b/0", "a/1", "zz/9"]]  # zz: a record the plan lacks
    (tmp_path / RECORDS).write_text("".join(json.dumps(r) + "\n" for r in done))
    run = drive(Spread(), tmp_path, Console(file=io.StringIO()), records=RECORDS, label="items",
                chains=chains(2, 2), schedule=schedule(), world=world())  # fmt: skip
    assert [r["key"] for r in run.records] == ["a/0", "a/1", "b/0", "b/1", "zz/9"]


# --- on a local Ray -----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_chains_run_in_order_on_their_worker_passing_state(ray_up: None, tmp_path: Path) -> None:
    run = drive(Spread(workers=2), tmp_path, Console(file=io.StringIO()), records=RECORDS, label="items",
                chains=chains(3, 3), schedule=schedule(), world=world())  # fmt: skip
    on_disk = lines(tmp_path / RECORDS)
    plan_order = [f"{c}/{i}" for c in "abc" for i in range(3)]
    assert [r["key"] for r in run.records] == plan_order  # handed on in the plan's order, however they finished
    assert sorted(run.records, key=lambda r: r["key"]) == sorted(on_disk, key=lambda r: r["key"])
    assert run.planned == 9 and not run.failed and run.pending == 0 and run.retried == 0
    for c in "abc":
        mine = [r for r in on_disk if r["key"].startswith(f"{c}/")]
        assert [r["index"] for r in mine] == [0, 1, 2]  # in order
        assert [r["got"] for r in mine] == [0, 1, 3]  # each on the state the one before left
        assert len({r["actor"] for r in mine}) == 1  # pinned: one worker per chain
    assert len({r["actor"] for r in on_disk}) == 2


@pytest.mark.slow
def test_a_failed_item_stops_its_chain_and_a_rerun_resumes_it(ray_up: None, tmp_path: Path) -> None:
    out = io.StringIO()
    first = drive(Spread(), tmp_path, Console(file=out, width=200), records=RECORDS, label="items",
                  chains=chains(2, 3), schedule=schedule(), world=world(run=1, fail=("a/1",)))  # fmt: skip
    assert sorted(r["key"] for r in first.records) == ["a/0", "b/0", "b/1", "b/2"]
    assert [f["key"] for f in first.failed] == ["a/1"] and first.pending == 1  # a/2 waits on a/1
    assert [r["key"] for r in lines(tmp_path / "failed.jsonl")] == ["a/1"]
    assert "item a/1 failed: endpoint down (a rerun runs it again)" in out.getvalue()

    again = drive(Spread(), tmp_path, Console(file=io.StringIO()), records=RECORDS, label="items",
                  chains=chains(2, 3), schedule=schedule(), world=world(run=2))  # fmt: skip
    on_disk = lines(tmp_path / RECORDS)
    assert [r["key"] for r in on_disk if r["run"] == 2] == ["a/1", "a/2"]  # only what was left ran
    assert [r["got"] for r in on_disk if r["run"] == 2] == [1, 3]  # from the state a/0 left on disk
    assert len(again.records) == 6 and not again.failed and again.pending == 0


@pytest.mark.slow
def test_a_run_where_everything_failed_fails_in_one_line(ray_up: None, tmp_path: Path) -> None:
    run = drive(Spread(workers=1), tmp_path, Console(file=io.StringIO()), records=RECORDS, label="items",
                chains=chains(1, 2), schedule=schedule(), world=world(fail=("a/0",)))  # fmt: skip
    assert run.records == [] and [r["key"] for r in run.failed] == ["a/0"] and run.pending == 1  # to report first
    with pytest.raises(MemrlError) as caught:
        run.check("run")
    assert re.fullmatch(
        r"run: 1 of 2 items failed, 1 more waited on them, none finished \(first: item a/0: endpoint down\)",
        str(caught.value),
    )
    assert not (tmp_path / RECORDS).exists()


@pytest.mark.slow
def test_a_result_never_lands_twice_and_at_once_bounds_independent_work(ray_up: None, tmp_path: Path) -> None:
    # Two chains of one item each that both come back with key "x/0", plus independent work one at a time.
    twice = [Chain("x", [Item("x", 0)], 0), Chain("y", [Item("x", 0)], 0)]
    alone = [Chain(c.id, c.items[:1], 0) for c in chains(4, 1)]
    run = drive(Spread(workers=2), tmp_path, Console(file=io.StringIO()), records=RECORDS, label="items",
                chains=twice + alone, schedule=schedule(pinned=False, at_once=1), world=world())  # fmt: skip
    keys = [r["key"] for r in lines(tmp_path / RECORDS)]
    assert keys == ["x/0", "a/0", "b/0", "c/0", "d/0"]  # once, and in plan order: one in flight at a time
    assert len({r["actor"] for r in run.records}) == 2  # unpinned: the workers in turn
