"""`memrl world serve` played by OpenEnv's own client on 127.0.0.1: the episode it serves is memrl's.

OpenEnv's `GenericEnvClient` (its WebSocket client) plays a collab and a TOD episode against the server and gets the
record memrl's own driver (`envs.episode.play`) writes for the same seed and replies; a multi-session episode shows
oracle notes earning more in the later sessions than no notes (rule user, scripted note reader); what the server
refuses comes back as one error to that client while the server keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from support import FIXTURES, announced, memrl_in_process

pytest.importorskip("openenv")

from openenv.core.generic_client import GenericEnvClient

from memrl.envs.collab.scripted_reader import ScriptedReader
from memrl.envs.episode import play
from memrl.integrations.worlds import build_world
from memrl.rollout.serve import free_port

CLOCK = ("started_at", "finished_at")  # wall-clock times: the only fields two plays of one episode differ in


@contextlib.contextmanager
def _served(*args: str) -> Iterator[str]:
    """`memrl world serve ARGS --port P` as a process; yields its URL once it says it listens."""
    port = free_port()
    with announced(["world", "serve", *args, "--port", port], "serving memrl world", stderr=subprocess.PIPE):
        yield f"http://127.0.0.1:{port}"


def _strip_clock(record: Any) -> Any:
    if isinstance(record, dict):
        return {k: _strip_clock(v) for k, v in record.items() if k not in CLOCK}
    if isinstance(record, list):
        return [_strip_clock(v) for v in record]
    return record


def _collab_reply(observation: list[dict[str, Any]]) -> str:
    """A deterministic agent: a chatty reply (the scripted reader with no notes) that names a number."""
    said = sum(m["role"] == "assistant" for m in observation)
    return f"Sure! Let me think about it. My answer is {said + 3}."


def _tod_reply(observation: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """A deterministic reader: confirms every slot value the dialogue has named so far."""
    slots: dict[str, str] = {}
    for message in observation:
        slots |= message.get("slots") or {}
    text = "To confirm: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in sorted(slots.items())) + "."
    return text, {"slots": slots}


async def _play_openenv(url: str, seed: int, reply: Any, **options: Any) -> tuple[Any, list[Any], int]:
    """One episode through OpenEnv's client: (the final result, every observation's messages, steps)."""
    async with GenericEnvClient(base_url=url) as env:
        result = await env.reset(seed=seed, **options)
        seen = [result.observation["messages"]]
        steps = 0
        while not result.done:
            text, annotations = reply(result.observation["messages"])
            result = await env.step({"reply": text, "annotations": annotations})
            seen.append(result.observation["messages"])
            steps += 1
        return result, seen, steps


def _driver_record(world_name: str, config: dict[str, Any], seed: int, reply: Any) -> tuple[dict[str, Any], Any]:
    """The same episode through memrl's own driver: (its record, the final step)."""
    world = build_world(world_name, config)
    episode = world.episode(seed)

    async def policy(observation: list[Any]) -> Any:
        return reply(observation)

    final = asyncio.run(play(episode, policy, seed=seed))
    return json.loads(json.dumps(episode.record())), final


def test_openenv_client_plays_collab_as_memrl_driver_does() -> None:
    with _served("collab", "--max-turns", "6") as url:
        reply = lambda obs: (_collab_reply(obs), {})  # noqa: E731
        result, seen, steps = asyncio.run(_play_openenv(url, 11, reply))
        record, final = _driver_record("collab", {"max_turns": 6}, 11, reply)
        again, _, _ = asyncio.run(_play_openenv(url, 11, reply))  # one seed, one episode
    served = result.observation["record"]
    print(f"collab over OpenEnv: {steps} steps, reward {result.reward}, parts {result.observation['reward_parts']}")
    assert result.done and steps >= 1
    assert _strip_clock(served) == _strip_clock(record)
    assert result.observation["reward_parts"] == final.reward
    assert result.observation["terminated"] == final.terminated and result.observation["truncated"] == final.truncated
    assert seen[-1] == final.observation
    world = build_world("collab", {"max_turns": 6})
    assert result.reward == pytest.approx(world.reward(record, final.reward))
    assert _strip_clock(again.observation["record"]) == _strip_clock(served)
    # the seed reaches the user's draws: another seed is another user, problem and phrasing
    assert served["user_id"] == "user-11-0" and served["turns"][0]["content"] == seen[0][0]["content"]


def test_openenv_client_plays_tod_as_memrl_driver_does() -> None:
    data = FIXTURES / "mstod"
    with _served("tod", "--data", str(data)) as url:
        result, _seen, steps = asyncio.run(_play_openenv(url, 5, _tod_reply))
    record, final = _driver_record("tod", {"data": data}, 5, _tod_reply)
    print(f"tod over OpenEnv: {steps} steps, reward {result.reward}, parts {result.observation['reward_parts']}")
    assert result.done
    assert result.observation["record"] == record
    assert result.observation["reward_parts"] == final.reward
    assert result.reward == final.reward["success"]


async def _multi_session(url: str, seed: int, reflector: str) -> Any:
    """A 3-session episode played by the scripted note reader: each reply follows the notes in force."""
    reader = ScriptedReader()
    async with GenericEnvClient(base_url=url) as env:
        result = await env.reset(seed=seed, reflector=reflector)
        notes = ""
        while not result.done:
            [text] = await reader.replies([(notes, result.observation["messages"])])
            result = await env.step({"reply": text})
            notes = result.observation["info"].get("notes", notes)
        return result


def test_multi_session_notes_change_the_later_sessions_reward() -> None:
    with _served("collab", "--sessions", "3", "--max-turns", "4") as url:
        oracle = asyncio.run(_multi_session(url, 3, "oracle"))
        empty = asyncio.run(_multi_session(url, 3, "empty"))
    o, e = oracle.observation, empty.observation
    print(f"later sessions' preference share: oracle notes {oracle.reward:.3f}, no notes {empty.reward:.3f}")
    assert len(o["record"]["sessions"]) == len(e["record"]["sessions"]) == 3
    assert o["reward_parts"]["first_preference"] == e["reward_parts"]["first_preference"]  # same user, no notes yet
    assert [s["notes_before"] for s in e["record"]["sessions"]] == ["", "", ""]
    assert o["record"]["sessions"][1]["notes_before"] and o["record"]["sessions"][0]["notes_before"] == ""
    assert oracle.reward == o["reward_parts"]["preference"] > empty.reward


def test_bad_input_gets_one_error_and_the_server_keeps_serving() -> None:
    async def go(url: str) -> list[str]:
        errors: list[str] = []

        async def refused(call: Any) -> None:
            with pytest.raises(RuntimeError) as caught:
                await call
            errors.append(str(caught.value))

        async with GenericEnvClient(base_url=url) as env:
            await refused(env.step({"reply": "hello"}))  # before reset
            result = await env.reset(seed=2)
            await refused(env.step({"reply": 5}))  # a reply that is not text
            await refused(env.step({"text": "hello"}))  # a field actions do not have
            await refused(env.step({"reply": "hi", "annotations": {"mood": "good"}}))  # an annotation collab lacks
            await refused(env.reset(seed=-1))
            await refused(env.reset(seed=2, reflector="psychic"))
            result = await env.reset(seed=2)
            while not result.done:
                result = await env.step({"reply": _collab_reply(result.observation["messages"])})
            await refused(env.step({"reply": "one more"}))  # after the last step
            again = await env.reset(seed=2)  # the same connection plays on
            assert not again.done

        # a client that dies mid-episode: its socket closes with the episode running
        dead = GenericEnvClient(base_url=url)
        await dead.connect()
        await dead.reset(seed=4)
        assert dead._ws is not None
        dead._ws.transport.abort()  # type: ignore[attr-defined]
        await asyncio.sleep(0.5)
        result, _, _ = await _play_openenv(url, 4, lambda obs: (_collab_reply(obs), {}))
        assert result.done
        return errors

    with _served("collab", "--max-turns", "3") as url:
        errors = asyncio.run(go(url))
        import urllib.request

        with urllib.request.urlopen(f"{url}/health", timeout=10) as health:
            assert health.status == 200
    for line in errors:
        print("refused:", line)
    assert len(errors) == 7 and all("\n" not in e for e in errors)
    assert "reset the episode before stepping it" in errors[0]
    assert "reply is text, not int" in errors[1]
    assert "not text" in errors[2]
    assert "takes no annotation mood" in errors[3]
    assert "seed must be a whole number" in errors[4]
    assert "reflector must be one of" in errors[5]
    assert "the episode is over" in errors[6]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["world", "serve", "chess"], "No such command 'chess'"),
        (["world", "serve", "collab", "--sessions", "0"], "sessions"),
        (["world", "serve", "collab", "--reflector", "psychic"], "reflector"),
        (["world", "serve", "collab", "--host", "not a host!"], "--host"),
        (["world", "serve", "tod", "--data", str(FIXTURES / "pahf")], "schema.json"),
    ],
)
def test_bad_serve_flags_are_one_line(argv: list[str], says: str) -> None:
    code, err = memrl_in_process(argv)
    assert code == 2, err
    assert err.count("\n") == 1 and says in err, err


def test_served_on_loopback_unless_told() -> None:
    with _served("pahf", "--data", str(FIXTURES / "pahf" / "shopping")) as url:
        assert url.startswith("http://127.0.0.1:")
        port = int(url.rsplit(":", 1)[1])
        names = [a for a in {i[4][0] for i in socket.getaddrinfo(socket.gethostname(), None)} if a != "127.0.0.1"]
        for address in names:
            with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as s:
                s.settimeout(1)
                assert s.connect_ex((address, port)) != 0, f"reachable at {address}"
        result, _, steps = asyncio.run(_play_openenv(url, 1, lambda obs: ("A", {})))
        assert result.done and steps == 1 and result.reward in (0.0, 1.0)


@pytest.mark.slow
def test_memrl_world_play_scores_an_episode_with_a_served_model(tiny_server: tuple[str, str]) -> None:
    """The docs' third command: OpenEnv's client with the model `memrl serve` serves as the agent."""
    url, name = tiny_server
    with _served("collab", "--max-turns", "2") as env:
        code, out = memrl_in_process(
            ["world", "play", "collab", "--env", env, "--model", f"{name}@{url}", "--seed", "9", "--max-tokens", "16"],
            stdout=True,
        )
    assert code == 0, out
    result = json.loads(out.strip().splitlines()[-1])
    print(f"memrl world play: reward {result['reward']}, parts {result['reward_parts']}")
    assert result["seed"] == 9 and result["record"]["user_id"] == "user-9-0"
    assert set(result["reward_parts"]) == {"task_success", "user_effort", "length"}
    assert "agent: " in out and result["reward"] == pytest.approx(
        build_world("collab", {"max_turns": 2}).reward(result["record"], result["reward_parts"])
    )
