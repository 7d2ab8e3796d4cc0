"""LLM backends behind one interface: local transformers, OpenAI-compatible HTTP, in-process vLLM."""

from memrl.rollout.base import ChatBackend, Completion, Conversation, Message, SamplingParams, Usage
from memrl.rollout.builder import build_backend
from memrl.rollout.json_output import JSONParseFailure, JSONResult, ParsedJSON, parse_json_object

__all__ = [
    "ChatBackend",
    "Completion",
    "Conversation",
    "JSONParseFailure",
    "JSONResult",
    "Message",
    "ParsedJSON",
    "SamplingParams",
    "Usage",
    "build_backend",
    "parse_json_object",
]
