"""In-process vLLM engine for GPU machines; vllm is imported only when this backend is built."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from memrl.core.errors import BackendError
from memrl.rollout.base import ChatBackend, Completion, Conversation, SamplingParams


def import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise BackendError(
            "the vllm backend needs vLLM, which is not installed: on a GPU machine run "
            "`pip install 'memrl[vllm]'`, or use backend 'hf' or 'openai'"
        ) from exc
    return vllm


class VLLMBackend(ChatBackend):
    name = "vllm"
    batch_size = 256  # the engine schedules continuously; hand it large batches

    def __init__(
        self,
        model_path: str,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.85,
        max_model_len: int | None = None,
        dtype: str = "auto",
    ) -> None:
        super().__init__()
        self._vllm = import_vllm()
        self.engine = self._vllm.LLM(
            model=model_path,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            dtype=dtype,
        )
        # One call at a time: the offline engine is not re-entrant (vllm-project/vllm#1285), and `achat` runs each
        # call in a thread of its own.
        self._lock = threading.Lock()

    def generate(self, conversations: Sequence[Conversation], params: SamplingParams | None = None) -> list[Completion]:
        params = params or SamplingParams()
        sampling = self._vllm.SamplingParams(
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_tokens,
            stop=list(params.stop) or None,
            seed=params.seed,
        )
        with self._lock:
            results = self.engine.chat([list(c) for c in conversations], sampling, use_tqdm=False)
        completions = []
        for result in results:
            output = result.outputs[0]
            completion = Completion(
                text=output.text,
                prompt_tokens=len(result.prompt_token_ids or []),
                completion_tokens=len(output.token_ids),
                finish_reason=output.finish_reason,
            )
            self.usage.record(completion)
            completions.append(completion)
        return completions

    def close(self) -> None:
        """Free the engine's GPU memory, so that the next engine built in this process passes vLLM's free-memory
        check (`eval reflector` builds one per model). vLLM 0.24 runs the engine core in a child process that holds
        the weights and KV cache until its client shuts it down; its own cleanup then drops the parallel groups,
        collects garbage and empties the CUDA cache."""
        engine = self.__dict__.pop("engine", None)
        if engine is None:  # closed already
            return
        engine.llm_engine.engine_core.shutdown()
        del engine
        from vllm.distributed import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
