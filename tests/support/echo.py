"""The toy episode the registry tests play: the user asks for a word; a reply that holds it ends the episode, else
the user asks again until `max_turns` replies."""

from __future__ import annotations

from typing import Any

from memrl.envs.episode import Step, check_step
from memrl.rollout.base import Message


class Echo:
    def __init__(self, word: str, max_turns: int = 2) -> None:
        self.word, self.max_turns = word, max_turns
        self._said: list[Message] | None = None
        self._replies: list[str] = []
        self._over = False

    async def reset(self, *, seed: int | None = None) -> list[Message]:
        self._said, self._replies, self._over = [{"role": "user", "content": f"Say the word {self.word}."}], [], False
        return list(self._said)

    async def step(self, reply: str, **annotations: Any) -> Step:
        said = [*check_step(self, annotations, self._said, over=self._over), {"role": "assistant", "content": reply}]
        self._replies.append(reply)
        hit = self.word in reply.lower()
        if hit or len(self._replies) == self.max_turns:
            self._said, self._over = said, True
            return Step(
                said, {"hit": float(hit), "replies": float(len(self._replies))}, terminated=hit, truncated=not hit
            )
        self._said = [*said, {"role": "user", "content": "No. Say it again."}]
        return Step(list(self._said))

    def record(self) -> dict[str, Any]:
        if not self._over:
            raise RuntimeError("the episode is not over")
        return {"word": self.word, "replies": list(self._replies)}
