"""ZeroMQ against the framed pipe at the engine boundary, alternating in one session (`--transport-ab`).

    .venv/bin/python -m bench.gateway_overhead --rate 100 --duration 3 --transport-ab 6

Each round measures one transport (EngineConfig.transport) twice with bench.gateway_overhead's tools: the
process engine called directly, then through `fairserve serve`. Rounds alternate zmq, pipe, pipe, zmq, ...
so the machine's drift hits both alike; the report is each figure's median per transport and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from bench.gateway_overhead import Poster, Served, engine_config, in_process, pct, through_gateway


async def transport_round(args: argparse.Namespace, tmp: str, transport: str, index: int) -> dict[str, float]:
    """One measurement of a transport: the process engine called directly, then through `fairserve serve`."""
    n = int(args.rate * args.duration)
    cfg = engine_config(str(Path(tmp) / "models"), args.max_num_seqs, transport)
    direct = await in_process(cfg, True, args.rate, n, args.stream_tokens)
    served = Served(str(Path(tmp) / f"{transport}-{index}"), "--max-num-seqs", str(args.max_num_seqs),
                    "--engine-process", "--transport", transport)
    poster = Poster(served, args.client)
    paired: list[float] = []
    try:
        model = (await poster.pool.request("GET", "/v1/models")).json()["data"][0]["id"]  # type: ignore[index]
        gateway = await through_gateway(poster, served, model, args.rate, n, args.stream_tokens, True, paired)
    finally:
        await poster.close()
        served.stop()
    return {"inproc_stream_total_p50_ms": direct.summary()["total_p50_ms"],
            "gateway_stream_total_p50_ms": gateway.summary()["total_p50_ms"],
            "paired_first_p50_ms": pct(paired, 0.5) * 1e3,
            "gateway_cpu_ms_per_request": gateway.summary()["cpu_ms_per_request"]}


async def transport_ab(args: argparse.Namespace) -> dict[str, object]:
    """ZeroMQ against the pipe, alternating (zmq, pipe, pipe, zmq, ...) so drift hits both alike; the ratio
    of each figure's median over the rounds, zmq / pipe (below 1: zmq is faster)."""
    rounds: dict[str, list[dict[str, float]]] = {"zmq": [], "pipe": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.transport_ab):
            order = ("zmq", "pipe") if i % 2 == 0 else ("pipe", "zmq")
            for transport in order:
                rounds[transport].append(await transport_round(args, tmp, transport, i))
    medians = {t: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for t, rs in rounds.items()}
    ratio = {k: medians["zmq"][k] / medians["pipe"][k] for k in medians["zmq"]}
    return {"rate": args.rate, "requests_per_round": int(args.rate * args.duration), "rounds": rounds,
            "median": medians, "ratio_zmq_over_pipe": ratio}
