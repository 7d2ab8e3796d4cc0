"""The memory judger: P(a stored QA pair fills a slot the dialogue is missing), trained with BCE.

Import-light: torch and transformers load when a judger is trained or loaded, not on import.
"""

from memrl.rollout.judger.inputs import JudgerInput
from memrl.rollout.judger.scorer import JudgerScorer, load_judger

__all__ = ["JudgerInput", "JudgerScorer", "load_judger"]
