"""The engine: validate and queue requests, then `step()` one iteration at a time.

    step():
        schedule   retire cancelled and expired requests, decode running requests, continue
                   prefills, admit by fairness policy, charge      (Scheduler / AsyncScheduler)
        execute    one forward on the mixed batch and sampling      (InlineExecutor / OverlapExecutor)
        update     append tokens, token-level stops                 (scheduler.update)
        outputs    detokenize, stop strings; one IterationTrace

With async scheduling (engine/core/async_scheduler.py, engine/worker/overlap.py) the same four calls run step N+1's
schedule while step N's forward runs, and `execute` returns step N.

A failure that belongs to one request (its sampling, its detokenisation, its stop check) ends that
request with finish_reason "error" and the iteration goes on (engine/core/isolation.py); only the batch's
forward pass, or the scheduler itself, raising out of `step()` stops the loop. A fault of a request's own
input found inside the step (RequestFault: its adapter failing its device slot or giving non-finite
logits, its grammar's mask failing) ends it the same way, and its outputs carry the fault, which the
gateway answers as a 400 naming the field; a faulty adapter is refused from then on (engine/worker/lora/intake.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from functools import partial
from time import perf_counter  # bound here: tests replace this module's `time` with a fake clock
from typing import cast

import torch

from engine.config import EngineConfig
from engine.core.errors import DuplicateRequestError, InvalidRequestError, RequestFault
from engine.core.family import choices_of, closes_request, make_family, with_families
from engine.core.isolation import RequestFailures
from engine.core.kv_cache import BlockPool
from engine.core.limits import RequestLimits
from engine.core.outputs import (
    EngineStats,
    OutputDelta,
    RequestInfo,
    RequestOutput,
    output_delta,
    request_output,
)
from engine.core.policy import build_policy
from engine.core.request import FinishReason, Request, RequestMeta, RequestState
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import SchedulerOutput
from engine.core.text_stream import TextStream, new_text, open_stream
from engine.core.trace import IterationTrace
from engine.serving.counter_sync import CounterSync
from engine.serving.parts import (
    build_grammar,
    build_runner,
    build_scheduler,
    charged_step_cost,
    grammar_masks,
)
from engine.serving.recorder import EngineRecorder
from engine.serving.tracing import make_engine_tracer
from engine.worker.attention import resolve_backend
from engine.worker.executor import InlineExecutor, Ran, land_logprobs
from engine.worker.kv_budget import blocks_from_memory, graph_plan
from engine.worker.loader import LoadedModel, load_ranks
from engine.worker.lora.intake import build_intake
from engine.worker.model_runner import RunnerParts, kv_block_bytes
from engine.worker.overlap import OverlapExecutor
from engine.worker.swap import Swapper
from fairness.shared import SharedCounters

# request, its stream, new token ids, new text, and whether the request ended: a choice of n > 1 ends it
# only as the last of its family to end (its own end shows as a finish_reason on a choice's output).
Emitted = tuple[Request, TextStream, list[int], str, bool]


class LLMEngine:
    """One model, one scheduler, one KV cache; driven by explicit `step()` calls."""

    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None) -> None:
        self.config = config  # validated by pydantic when built
        self.device = torch.device(config.device)
        # Tensor parallelism: ranks 1..N-1 start first; this process is rank 0 and loads its own shard.
        self.peers, self.loaded = load_ranks(config, loaded)
        try:
            self._build(config)
        except BaseException:
            if self.peers is not None:
                self.peers.close()
            raise

    def _build(self, config: EngineConfig) -> None:
        """Size the KV cache and build the parts (engine/serving/parts.py) over the loaded model."""
        mc = self.loaded.config
        self.tokenizer = self.loaded.tokenizer
        self.model_name = config.served_model_name or self.loaded.name
        self.max_model_len = min(
            config.max_model_len or mc.max_position_embeddings, mc.max_position_embeddings
        )
        self.vocab_size = mc.vocab_size
        self.eos_token_ids = set(mc.eos_token_ids) | set(self.tokenizer.eos_token_ids)
        backend = resolve_backend(config.attention_backend, self.device)
        # Decode graphs: under tensor parallelism every rank captures the same buckets, the collectives inside.
        graphs = graph_plan(config, self.device, backend, self.max_model_len, mc.vocab_size)
        num_blocks = config.num_kv_blocks or blocks_from_memory(
            config, self.loaded, self.max_model_len, graphs
        )
        self.pool = BlockPool(num_blocks, config.block_size, config.enable_prefix_caching)
        self.limits = RequestLimits(
            self.vocab_size, self.max_model_len, config.block_size, num_blocks, config.caps
        )
        self.policy = build_policy(config.fairness, self.pool, charged_step_cost(config, mc))
        peers = self.peers
        if peers is not None:  # ranks 1..N-1 allocate their share of the cache, then capture beside this one
            peers.allocate(num_blocks, None if graphs is None else graphs.sizes, self.max_model_len)
        # LoRA adapters (engine/worker/lora/): the `--lora` entries load here, the gateway's on demand, off this loop.
        self.lora = build_intake(config, mc, self.loaded.dtype, self.device, self.policy)
        masks = grammar_masks(self.tokenizer, mc.vocab_size, self.eos_token_ids, self.max_model_len)
        # Whole when built: the KV cache, then the decode graphs captured over it (under tensor parallelism
        # every rank captures the same buckets, and one failure sends all to eager).
        parts = RunnerParts(peers, self.lora, masks, graphs, None if peers is None else peers.agree)
        self.runner = build_runner(config, self.loaded, num_blocks, backend, self.device, parts)
        assert self.runner.grammar is not None  # built from `masks`
        self.grammar = build_grammar(
            config, self.tokenizer, mc.vocab_size, self.eos_token_ids, self.runner.grammar
        )
        self.executor = (OverlapExecutor if config.overlaps() else InlineExecutor)(self.runner, self.pool)
        block_bytes = kv_block_bytes(
            mc.num_layers, config.block_size, mc.num_kv_heads, mc.head_dim, self.loaded.dtype
        )
        swapper = Swapper(self.executor, self.pool, self.runner, block_bytes, config.swap_space_bytes)
        self.scheduler = build_scheduler(
            config,
            self.pool,
            self.policy,
            self.max_model_len,
            mc,
            slots=self.lora,
            swap=swapper,
            waits=(self.lora, self.grammar),  # an adapter's load, then a grammar's compile
        )
        self._build_step_state(config)

    def detokenize_in_front(self) -> None:
        """From now on, a request without stop strings leaves its text to the front (engine/serving/boundary/front.py):
        its outputs carry token ids only."""
        self.front_detokenizes = True

    def _build_step_state(self, config: EngineConfig) -> None:
        """What the steps keep beside the parts: streams, traces, failures, tracing and the shared
        fair-share counters."""
        self._streams: dict[str, TextStream] = {}
        # True under the engine loop (engine/serving/boundary/worker.py, `detokenize_in_front`): its front detokenizes
        # every request without stop strings, off this loop, and such a request's outputs here carry token ids
        # and no text.
        self.front_detokenizes = False
        self.recorder = EngineRecorder(
            self.scheduler, self.pool, config.trace_path, config.max_num_batched_tokens, config.max_num_seqs
        )
        self.traces = self.recorder.traces
        self._last_step: dict[
            str, tuple[int, float, float]
        ] = {}  # request -> (tokens, start, end) of its last iteration
        self._failures = RequestFailures()  # detokenisation and stop checks; the sampler keeps its own
        self._families = 0  # requests of n > 1 choices whose last output has not gone out
        self.failed_requests = 0  # requests ended alone by an exception of their own, since start
        self.tracer = make_engine_tracer(config.otlp_endpoint)  # None unless traces are configured
        # One fair share across engines: other engines' service reaches the policy's counters at step starts.
        self.counter_sync: CounterSync | None = None
        if config.redis_url is not None:
            self.counter_sync = CounterSync(
                config.redis_url, config.counter_sync_interval_s, config.counter_sync_prefix
            )
            self.counter_sync.start()

    # -- intake -----------------------------------------------------------------------------
    def validate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> None:
        """Raise a specific InvalidRequestError for input the engine cannot serve."""
        self.limits.validate(prompt_token_ids, params)

    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        """Token ids of a prompt given as text or ids."""
        return self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)

    def add_request(
        self,
        request_id: str,
        prompt: str | Sequence[int],
        params: SamplingParams,
        meta: RequestMeta | None = None,
    ) -> Request:
        """Validate and queue a request; raises InvalidRequestError (or a subclass) and queues nothing on bad input."""
        if request_id in self.scheduler.requests or request_id in self._streams:
            raise DuplicateRequestError(f"request id {request_id!r} is already live", "request_id")
        ids = self.encode(prompt)
        self.validate(ids, params)
        if params.n > 1:
            return self._add_family(request_id, ids, params, meta or RequestMeta())
        request = Request(request_id, ids, params, meta or RequestMeta())
        if request.meta.decode_part:  # a decode engine's request: its prompt's KV comes from a prefill engine
            self.scheduler.hold(request, RequestState.WAITING_FOR_KV)
        else:  # queued, or held for its adapter or grammar (engine/core/waits.py)
            self.scheduler.add(request)
        self._streams[request_id] = self._stream(request)
        self.grammar.note_preprocessing(request_id, request.meta.preprocess_cpu_s)
        return request

    def drop_held(self, request_id: str) -> None:
        """Drop a request whose prompt's KV did not come (engine/serving/disagg.py answers it)."""
        if self.scheduler.unhold(request_id) is not None:
            self._streams.pop(request_id, None)

    def _add_family(
        self, request_id: str, ids: list[int], params: SamplingParams, meta: RequestMeta
    ) -> Request:
        """Queue a request of n choices: its leader (choice 0, returned) now, the others forked from the
        leader's prompt KV once it is computed (engine/core/family.py, engine/core/scheduler_state.py `_fork`)."""
        n = params.n
        if n > self.config.max_num_seqs:
            raise InvalidRequestError(
                f"n is {n}; this engine runs at most {self.config.max_num_seqs} sequences", "n"
            )
        if meta.kv_handoff is not None:
            raise InvalidRequestError("n > 1 is not served across separate prefill and decode engines", "n")
        # Sliding-window layers keep their KV per request outside the pool (engine/worker/window_cache.py): there is
        # no prompt KV to share, so each choice computes its prompt (still charged once).
        fork_at = 0 if self.runner.windows is not None else len(ids)
        family = make_family(request_id, ids, params, meta, fork_at)
        self.scheduler.add(
            family.leader
        )  # one compile, a matcher per choice (engine/worker/grammar/intake.py)
        for member in family.members:
            self._streams[member.request_id] = self._stream(member)
        self.grammar.note_preprocessing(request_id, meta.preprocess_cpu_s)  # once, to the leader
        self._families += 1
        return family.leader

    def _stream(self, request: Request) -> TextStream:
        return open_stream(self.tokenizer, request, self.front_detokenizes)

    def abort_request(
        self, request_id: str, reason: str = "cancelled", signal_time: float | None = None
    ) -> bool:
        """Cancel at the next iteration boundary; tokens computed after `signal_time` are counted against it."""
        ok = self.scheduler.abort(request_id, reason, signal_time)
        request = self.scheduler.requests.get(request_id)  # (of n choices, choice 0 may have ended)
        if ok and request is not None:
            tokens, start, end = self._last_step.get(request_id, (0, 0.0, 0.0))
            t = request.cancel_time or time.time()
            # The iteration that was running when the signal came had already computed these tokens.
            if start <= t < end:
                request.tokens_after_cancel += tokens
        return ok

    def cancel_task(self, task_id: str, reason: str = "cancelled") -> list[str]:
        """Abort every live request of a task."""
        ids = [r.request_id for r in self.scheduler.requests.values() if r.meta.task_id == task_id]
        return [i for i in ids if self.abort_request(i, reason)]

    def has_unfinished(self) -> bool:
        """True while any request is queued or running, or a step's results have not landed."""
        return self.scheduler.has_unfinished() or self.executor.in_flight

    def take_refused(self) -> list[tuple[str, InvalidRequestError]]:
        """Requests refused after `add_request` accepted them (their grammar or adapter failed); the loop
        reports each."""
        refused = []
        for request, exc in self.scheduler.take_refused():
            refused.append((request.request_id, exc))
            for member in choices_of(request):
                self._streams.pop(member.request_id, None)
            if request.family is not None:
                self._families -= 1
        return refused

    def live_request(self, request_id: str) -> RequestInfo | None:
        """Owner and state of a live request."""
        r = self.scheduler.requests.get(request_id)
        if r is None:
            return None
        return RequestInfo(r.request_id, r.meta.tenant_id, r.meta.task_id, r.state.value)

    # -- one iteration ----------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one iteration; returns an output for every request that produced text or ended."""
        return [
            request_output(r, stream.stop.text[: stream.stop.emitted], new_ids, delta, done)
            for r, stream, new_ids, delta, done in self._iterate()
        ]

    def step_deltas(self) -> list[OutputDelta]:
        """`step` without the running totals: no copy of every token and character so far, per stream, per
        iteration (O(context) each). The engine loop uses this; its front rebuilds the totals."""
        return [output_delta(r, new_ids, delta, done) for r, _, new_ids, delta, done in self._iterate()]

    def _iterate(self) -> list[Emitted]:
        """One iteration, with or without async scheduling: what each request has new to report."""
        if self.counter_sync is not None:
            self.counter_sync.exchange(
                cast(SharedCounters, self.policy)
            )  # config checked that it shares counters
        p0, t0 = perf_counter(), time.time()
        scheduled = self.scheduler.schedule(t0)
        faulted = self._end_faulted(t0)  # heads whose adapter failed its device slot while admitted
        p1 = perf_counter()
        ran = self.executor.execute(scheduled, t0)  # this step; with async scheduling, the one before
        self.lora.note_in_flight(scheduled.chunks if self.executor.in_flight else [])
        self.fail_requests(ran.failures, ran.ended)
        self.grammar.charge(self.policy, self.scheduler.requests)
        self.note_ran(ran.out, ran.started, ran.ended)
        p2 = perf_counter()
        finished = self.scheduler.update(ran.out, ran.sampled, self.eos_token_ids, ran.ended)
        if ran.logprobs:
            land_logprobs(ran)
        p3 = perf_counter()
        outputs = self.collect_outputs(scheduled.finished + faulted + [c.request for c in ran.out.chunks])
        self._trace_step(ran, len(finished) + len(scheduled.finished), (p0, p1, p2, p3, perf_counter()))
        return outputs

    def _trace_step(self, ran: Ran, completions: int, marks: tuple[float, ...]) -> None:
        """One IterationTrace row for the step that ran, with where this call's host time went."""
        p0, p1, p2, p3, p4 = marks
        trace = self.record_trace(ran.out, ran.ended - ran.started, completions)
        timing = ran.timing
        trace.schedule_s, trace.prepare_s = p1 - p0, ran.prepare_s
        trace.forward_s, trace.sample_s = timing.forward_s, timing.sample_s
        trace.update_s, trace.outputs_s = p3 - p2, p4 - p3
        trace.wait_s, trace.overlapped_s = ran.wait_s, ran.overlapped_s
        trace.discarded_tokens = ran.out.discarded_tokens
        self.write_trace(trace)

    def note_ran(self, out: SchedulerOutput, t0: float, t1: float) -> None:
        """The step scheduled at `t0` ran until `t1`: what a cancel signal inside that window finds computed."""
        if self.tracer is not None:
            self.tracer.note_chunks(out, t0, t1)
        for c in out.chunks:
            self._last_step[c.request.request_id] = (c.length, t0, t1)
            if c.request.cancel_time is not None and c.request.cancel_time < t0:
                c.request.tokens_after_cancel += c.length

    def collect_outputs(self, touched: Iterable[Request]) -> list[Emitted]:
        """Every touched request with new tokens or text, or that ended (only the last for a whole response)."""
        outputs = []
        # Only while a request of several choices is live is a touched request's family looked up.
        requests = with_families(touched) if self._families else {r.request_id: r for r in touched}.values()
        for request in requests:
            stream = self._streams.get(request.request_id)
            if stream is None:
                continue
            text = self._failures.run(
                request.request_id, partial(new_text, request, stream, self.scheduler.finish), None
            )
            if text is None:  # its detokenisation or stop check raised: it ends alone, with what it had
                self.fail_requests(self._failures.take(), time.time())
                request.finish_reason = FinishReason.ERROR  # also when it had just ended for another reason
                text = ""
            new_ids = request.output_token_ids[stream.sent_tokens :]
            if not new_ids and not request.is_finished:
                continue
            stream.sent_tokens = len(request.output_token_ids)
            if not request.sampling.stream_outputs and stream.emitted_tokens and not request.is_finished:
                stream.held_delta += text
                continue
            delta, stream.held_delta = stream.held_delta + text, ""
            new_ids = request.output_token_ids[stream.emitted_tokens :]
            stream.emitted_tokens = len(request.output_token_ids)
            ends = closes_request(request)
            if ends and request.family is not None:
                self._families -= 1
            outputs.append((request, stream, new_ids, delta, ends))
            if request.is_finished:
                self._forget(request.request_id)
                if self.tracer is not None:
                    self.tracer.finished(request)
        return outputs

    def fail_requests(self, errors: dict[str, Exception], now: float) -> None:
        """End each request whose own work raised, with finish_reason "error"; the others go on. A
        RequestFault is kept on the request (its outputs carry it), and one naming `model` (its adapter's
        rows were not finite) has its adapter refused from now on."""
        for request_id, exc in errors.items():
            request = self.scheduler.requests.get(request_id)
            if request is None or request.is_finished:
                continue
            if isinstance(exc, RequestFault):
                if exc.field_name == "model":
                    self.lora.blame_adapter_of(request, str(exc))
                self._fault(request, exc, now)
            else:
                self.scheduler.finish(request, FinishReason.ERROR, now)
            self.failed_requests += 1

    def _fault(self, request: Request, exc: RequestFault, now: float) -> list[Request]:
        """End a request for a fault of its own input: every choice of its family (the request is refused
        as a whole, a 400), each carrying the fault. Returns the choices ended now."""
        ended = []
        for member in choices_of(request):
            member.fault = exc
            if not member.is_finished:
                self.scheduler.finish(member, FinishReason.ERROR, now)
                ended.append(member)
        return ended

    def _end_faulted(self, now: float) -> list[Request]:
        """End the requests whose adapter faulted while the scheduler admitted (engine/worker/lora/intake.py)."""
        ended = []
        for request, exc in self.lora.take_faulted():
            if not request.is_finished:
                ended += self._fault(request, exc, now)
                self.failed_requests += 1
        return ended

    def _forget(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        self._last_step.pop(request_id, None)
        self.executor.forget(request_id)  # overlapped: once the forward in flight cannot sample it
        self.runner.forget(request_id)
        self.grammar.forget(request_id)
        self.lora.forget(request_id)

    def write_trace(self, trace: IterationTrace) -> None:
        """Append a finished trace row to the trace file, if one is configured."""
        self.recorder.write(trace)

    def record_trace(self, out: SchedulerOutput, seconds: float, completions: int) -> IterationTrace:
        """The trace row of the step that ran (engine/serving/recorder.py)."""
        return self.recorder.record(out, seconds, completions)

    def stats(self) -> EngineStats:
        """A fresh snapshot of queue, memory and rate figures."""
        return self.recorder.snapshot(self.policy, self.counter_sync)

    def close(self) -> None:
        """Stop the forward thread, the other tensor-parallel ranks and the counter sync; release the trace file."""
        self.executor.close()
        if self.peers is not None:
            self.peers.close()
        self.grammar.close()
        self.lora.close()
        if self.counter_sync is not None:
            self.counter_sync.close()
        self.recorder.close()
        if self.tracer is not None:
            self.tracer.shutdown()
