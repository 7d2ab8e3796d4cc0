"""Stop a GRPO run whose rewards stay missing, instead of training on nothing.

A sample whose judge (or user, or outcome agent) failed has no score, and both trainers give it advantage 0; when
the endpoint is down for good, every sample fails and the run turns into a long no-op that only logs warnings.
`UnscoredWatch` sees each training step's count of unscored samples (the `memrl_grpo` estimator under verl, the
GRPO trainer's rewards under TRL) and raises once more than `max_share` of them were unscored in `steps`
consecutive steps, in one line naming what can leave a sample unscored (the endpoints, by URL and model, never a key)
and the counts.

verl's estimator runs in verl's own process: it learns the limits and the endpoints from MEMRL_UNSCORED (JSON, no
secret), which the launchers put in the job's Ray runtime environment; without it, it uses the defaults.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

from memrl.core.errors import BackendError, ConfigError
from memrl.rewards.config import UnscoredStop

UNSCORED_ENV = "MEMRL_UNSCORED"


class UnscoredWatch:
    """Counts consecutive training steps with too many unscored samples; raises BackendError at the limit."""

    def __init__(self, stop: UnscoredStop | None = None, sources: Sequence[str] = ()) -> None:
        self.stop = stop or UnscoredStop()
        self.sources = list(sources)
        self.streak: list[tuple[int, int]] = []  # (unscored, total) of the steps over the limit, in a row

    def observe(self, unscored: int, total: int) -> None:
        """One training step: `unscored` of its `total` samples had no score."""
        if total <= 0 or unscored / total <= self.stop.max_share:
            self.streak.clear()
            return
        self.streak.append((unscored, total))
        if len(self.streak) >= self.stop.steps:
            counts = ", ".join(f"{u}/{t}" for u, t in self.streak[-self.stop.steps :])
            what = "; ".join(self.sources) or "the reward's models"
            raise BackendError(
                f"training stopped: more than {self.stop.max_share:.0%} of the samples had no score in "
                f"{self.stop.steps} steps in a row (unscored per step: {counts}); check {what}"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> UnscoredWatch:
        """The watch the launcher described in MEMRL_UNSCORED (defaults without it)."""
        raw = (os.environ if environ is None else environ).get(UNSCORED_ENV)
        if not raw:
            return cls()
        try:
            data = json.loads(raw)
            return cls(UnscoredStop.model_validate(data.get("stop", {})), [str(s) for s in data.get("sources", [])])
        except (ValueError, AttributeError) as exc:
            raise ConfigError(f"{UNSCORED_ENV} is not a valid description of the unscored stop: {exc}") from None


def unscored_env(stop: UnscoredStop, sources: Sequence[str]) -> dict[str, str]:
    """The environment entry that tells verl's estimator the limits and what to name (no secret: sources are
    endpoint URLs and model names, already redacted)."""
    return {UNSCORED_ENV: json.dumps({"stop": stop.model_dump(mode="json"), "sources": list(sources)})}
