"""`python -m bench.vllm_sim`: serve the simulated vLLM engine on 127.0.0.1 until SIGINT/SIGTERM.

With `--port 0` (the default) it binds a free port itself and prints `READY http://127.0.0.1:PORT` on
stdout once it answers, so a starter never races another process for a port it picked.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from collections.abc import Sequence

import uvicorn

from bench.vllm_sim import READY
from bench.vllm_sim.app import SimConfig, create_app


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    d = SimConfig()
    p = argparse.ArgumentParser(prog="python -m bench.vllm_sim", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: a free port, printed on the READY line")
    p.add_argument("--model", default=d.model, help="the one served model name")
    p.add_argument("--max-num-seqs", type=int, default=d.slots, help="batch slots (vLLM's --max-num-seqs)")
    p.add_argument("--step-ms", type=float, default=d.step_s * 1e3, help="one decode step of the batch")
    p.add_argument("--max-model-len", type=int, default=d.max_model_len)
    p.add_argument("--kv-tokens", type=int, default=d.kv_tokens, help="the KV budget, in tokens")
    p.add_argument("--no-metrics", action="store_true", help="answer 404 on /metrics")
    return p.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    config = SimConfig(
        model=args.model,
        slots=args.max_num_seqs,
        step_s=args.step_ms / 1e3,
        max_model_len=args.max_model_len,
        kv_tokens=args.kv_tokens,
        metrics=not args.no_metrics,
    )
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    server = uvicorn.Server(uvicorn.Config(create_app(config), log_level="warning", lifespan="on"))
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started and not serving.done():
        await asyncio.sleep(0.01)  # uvicorn offers no started event; this only polls its flag
    if server.started:
        host, port = sock.getsockname()[:2]
        print(f"{READY} http://{host}:{port}", flush=True)
    await serving


def main(argv: Sequence[str] | None = None) -> int:
    asyncio.run(serve(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
