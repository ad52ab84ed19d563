"""Where a request's gateway CPU goes, measured in place: the whole server, under the benchmark's load.

    .venv/bin/python -m experiments.gateway_segments [--requests 1500] [--stream] [--detail]

`gateway_stages` cuts the pipeline after each stage and measures each cut server alone; a cut server
never waits for an engine, so its code runs with the caches it left warm. This measures the whole
server as `bench.gateway_cpu` runs it (the engine in its own process, the same closed-loop load) and
splits its event loop thread's CPU (`time.thread_time_ns`, read around each piece) by what ran:

    http_in   uvicorn's data_received: httptools parsing, the request's cycle and task
    request   the request's ASGI task, every step (edge, pipeline, the reply's writes)
    report    the engine's reports: ZeroMQ read, decode, dispatch, the runs' feeds, the ledger row
    flush     a loop pass's ZeroMQ send of Submits
    ended     the run's end callback (queue slot, metrics, quota settle)
    gc        the cyclic garbage collector, wherever it ran
    loop      the rest of the loop thread: uvloop itself, epoll, timers, task switching

and adds every other thread of the process (schedstat, less its idle rate sampled for `--idle-s` first,
by Python's thread name where it is one of Python's, else the kernel's: ZeroMQ's I/O thread is
`ZMQbg/IO/0`) and the loop thread's context switches. With `--detail` the
pipeline's stages are timed too, each inclusive of what it calls (so they overlap, and the timers'
own cost, about 0.6 µs a read here, inflates them): a map, not a sum. Each figure is per request.
Run with `--serve FILE serve ARGS...` it is the server itself (what the driver starts).
Results: docs/gateway.md, "Where the CPU goes, in place".
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import inspect
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Generator
from pathlib import Path
from time import thread_time_ns as _now
from typing import Any

SEGMENTS = ("http_in", "request", "report", "flush", "ended", "gc")
DETAIL = (
    "gateway.edge.middleware:EdgeMiddleware.__call__",
    "gateway.openai.generation:refuse_spent_tenant",
    "gateway.openai.routes:GenerationRoutes.__call__",
    "gateway.openai.generation:door",
    "gateway.openai.generation:parse",
    "gateway.openai.parsing:parse_body",
    "gateway.openai.parsing:engine_input",
    "engine.core.tokenizer:Tokenizer.encode",
    "gateway.openai.generation:admit",
    "gateway.openai.generation:submit",
    "engine.serving.boundary.front:EngineFront.submit",
    "engine.core.limits:RequestLimits.validate",
    "gateway.openai.responses:RunResponse.__call__",
    "uvicorn.protocols.http.httptools_impl:RequestResponseCycle.send",
    "engine.serving.boundary.zmq_channel:ZmqFrontChannel.take_ready",
    "engine.serving.boundary.front:EngineFront._dispatch",
    "engine.serving.boundary.route:OutputRoute.expand",
    "gateway.openai.runs:RunFeed.__call__",
    "gateway.openai.runs:_final",
    "gateway.openai.submit:_record",
    "gateway.openai.context:RequestContext.usage_record",
    "billing.ledger:Ledger.record",
    "gateway.openai.submit:_observe",
)
_DETAIL_ENV = "FAIRSERVE_SEGMENTS_DETAIL"
_acc: dict[str, int] = dict.fromkeys(SEGMENTS, 0)


def _timed_sync(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = _now()
        try:
            return fn(*args, **kwargs)
        finally:
            _acc[name] += _now() - t0

    return timed


class _TimedCoro:
    """Awaits a coroutine, adding the CPU of each of its steps to `name`."""

    def __init__(self, coro: Any, name: str) -> None:
        self.coro, self.name = coro, name

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, value, error = self.coro, None, None
        while True:
            t0 = _now()
            try:
                step = coro.throw(error) if error is not None else coro.send(value)
            except StopIteration as stop:
                _acc[self.name] += _now() - t0
                return stop.value
            except BaseException:
                _acc[self.name] += _now() - t0
                raise
            _acc[self.name] += _now() - t0
            try:
                value, error = (yield step), None
            except BaseException as exc:  # thrown into us: pass it on
                value, error = None, exc


def _wrap(target: str) -> None:
    """Time `module:attr` or `module:Class.method` inclusively, under its own name."""
    module, path = target.split(":")
    owner: Any = importlib.import_module(module)
    *outer, attr = path.split(".")
    for part in outer:
        owner = getattr(owner, part)
    fn = getattr(owner, attr)
    _acc[path] = 0
    if inspect.iscoroutinefunction(fn):

        async def timed(*args: Any, **kwargs: Any) -> Any:
            return await _TimedCoro(fn(*args, **kwargs), path)

        setattr(owner, attr, timed)
    else:
        setattr(owner, attr, _timed_sync(path, fn))


def instrument(out: Path) -> None:
    """Wrap the segments (and with the detail flag the stages); SIGUSR2 resets the counters, SIGUSR1 dumps them."""
    from uvicorn.protocols.http import httptools_impl

    from engine.serving.boundary import process_engine
    from gateway.openai import submit

    proto = httptools_impl.HttpToolsProtocol
    proto.data_received = _timed_sync("http_in", proto.data_received)  # type: ignore[method-assign]
    cycle = httptools_impl.RequestResponseCycle
    run_asgi = cycle.run_asgi

    async def timed_run_asgi(self: Any, app: Any) -> None:
        await _TimedCoro(run_asgi(self, app), "request")

    cycle.run_asgi = timed_run_asgi  # type: ignore[method-assign]
    engine = process_engine.ProcessEngine
    engine._on_readable = _timed_sync("report", engine._on_readable)  # type: ignore[method-assign]
    engine._flush = _timed_sync("flush", engine._flush)  # type: ignore[method-assign]
    submit._ended = _timed_sync("ended", submit._ended)
    for target in DETAIL if os.environ.get(_DETAIL_ENV) else ():
        _wrap(target)
    gc_started, start = [0], [_now()]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            gc_started[0] = _now()
        else:  # a collection inside a timed piece counts there too; `gc` is its own line
            _acc["gc"] += _now() - gc_started[0]

    gc.callbacks.append(on_gc)

    def dump(*_: Any) -> None:
        names = {str(t.native_id): t.name for t in threading.enumerate()}  # Python's names for its threads
        out.write_text(
            json.dumps({**_acc, "main": _now() - start[0], "tid": threading.get_native_id(), "names": names})
        )

    def reset(*_: Any) -> None:
        for k in _acc:
            _acc[k] = 0
        start[0] = _now()

    signal.signal(signal.SIGUSR1, dump)
    signal.signal(signal.SIGUSR2, reset)


def _threads(pid: int) -> dict[str, tuple[str, int, int, int]]:
    """Each thread's name, ns of CPU (schedstat) and voluntary and involuntary context switches, by tid."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = dict(
                line.split(":\t", 1) for line in (task / "status").read_text().splitlines() if ":\t" in line
            )
            cpu = int((task / "schedstat").read_text().split()[0])
            vol, invol = int(status["voluntary_ctxt_switches"]), int(status["nonvoluntary_ctxt_switches"])
            found[task.name] = ((task / "comm").read_text().strip(), cpu, vol, invol)
        except (OSError, KeyError):
            continue  # a thread that ended meanwhile
    return found


async def run(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Start the instrumented server, warm it, measure `--requests`, and return µs (or counts) per request."""
    from bench.gateway_cpu import PROMPT, Server

    tmp = Path(tempfile.mkdtemp(prefix="gateway-segments-"))
    dump = tmp / "segments.json"
    serve = ["-m", "experiments.gateway_segments", "--serve", str(dump), "serve", "--port", "0"]
    server = Server("fairserve", [*serve, "--data-dir", str(tmp / "data")])
    try:
        conn = await asyncio.open_connection(*server.addr)
        model = json.loads((await server.request(conn, server.raw("GET")))[1])["data"][0]["id"]
        conn[1].close()
        body: dict[str, Any] = {"model": model, "prompt": PROMPT, "ignore_eos": True, "max_tokens": 1}
        if args.stream:
            body.update(max_tokens=16, stream=True)
        await server.drive(body, args.concurrency * 8, args.concurrency)
        pid = server.proc.pid
        os.kill(pid, signal.SIGUSR2)
        idle = _threads(pid)  # what the other threads spend with no request (timers, the prefix reload)
        await asyncio.sleep(args.idle_s)
        idle_rate = {
            t: (cpu - idle[t][1]) / args.idle_s for t, (_, cpu, _, _) in _threads(pid).items() if t in idle
        }
        before, started = _threads(pid), time.perf_counter()
        await server.drive(body, args.requests, args.concurrency)
        after, wall = _threads(pid), time.perf_counter() - started
        os.kill(pid, signal.SIGUSR1)
        while not dump.exists() or not dump.read_text():
            await asyncio.sleep(0.05)
        seg = json.loads(dump.read_text())
    finally:
        server.stop()
    n = args.requests
    loop_thread = {k: seg[k] / n / 1e3 for k in SEGMENTS}
    loop_thread["loop"] = seg["main"] / n / 1e3 - sum(loop_thread.values())
    others: dict[str, float] = {}
    switches: dict[str, float] = {}
    for tid, (name, cpu, vol, invol) in after.items():
        was = before.get(tid, (name, 0, 0, 0))
        if int(tid) == seg["tid"]:
            switches = {"voluntary": (vol - was[2]) / n, "involuntary": (invol - was[3]) / n}
        else:
            name = seg["names"].get(tid, name)  # e.g. the ledger's `fairserve-ledger`, not `python`
            spent = cpu - was[1] - idle_rate.get(tid, 0.0) * wall  # less its idle rate, as bench.gateway_cpu
            others[name] = others.get(name, 0.0) + spent / n / 1e3
    detail = {k: v / n / 1e3 for k, v in seg.items() if k not in (*SEGMENTS, "main", "tid", "names")}
    return {"loop thread, µs": loop_thread, "other threads, µs": others, "loop thread switches": switches} | (
        {"stages (inclusive, instrumented), µs": detail} if detail else {}
    )


def main(argv: list[str] | None = None) -> int:
    """Drive the instrumented server (or, with --serve, be it)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        instrument(Path(argv[1]))
        from gateway.cli import main as fairserve

        return fairserve(argv[2:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=1500)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--stream", action="store_true", help="16-token streams instead of max_tokens 1")
    p.add_argument("--detail", action="store_true", help="also time the pipeline's stages inclusively")
    p.add_argument("--idle-s", type=float, default=1.0, help="the other threads' idle rate sampled first")
    args = p.parse_args(argv)
    if args.detail:
        os.environ[_DETAIL_ENV] = "1"  # the server inherits it
    import uvloop

    report = uvloop.run(run(args))
    for section, rows in report.items():
        print(section)
        for name, value in rows.items():
            print(f"  {name:44} {value:8.1f}")
        if section != "loop thread switches" and "inclusive" not in section:
            print(f"  {'total':44} {sum(rows.values()):8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
