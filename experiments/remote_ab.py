"""Where the engine runs, alternating in one session (`--remote-ab`, `--curve-ab` of experiments.gateway_overhead).

    .venv/bin/python -m experiments.gateway_overhead --rate 100 --duration 3 --remote-ab 6

Each round measures one arm twice with experiments.gateway_overhead's tools: the engine called directly,
then through `fairserve serve`. The gateway's own worker process (`local`, ipc) against a `fairserve
engine` process reached over TCP (`remote`, engine/serving/remote/), alternating local, remote, remote, local,
...; the report is each figure's median per arm and the ratio remote / local.

    .venv/bin/python -m experiments.gateway_overhead --rate 100 --duration 3 --curve-ab 6

compares two remote engines, one with `--cluster-key` (CurveZMQ, engine/serving/remote/curve.py) and one without;
the ratio is curve / plain: what the encryption and the ZAP check cost a request.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

from engine.serving.remote.client import RemoteEngine
from engine.serving.remote.curve import ClusterKey
from experiments.gateway_overhead import Poster, Served, engine_config, in_process, pct, through_gateway
from gateway.settings import GatewaySettings


async def local_round(args: argparse.Namespace, tmp: str, index: int) -> dict[str, float]:
    """One measurement of the gateway's own worker process: called directly, then through `fairserve serve`."""
    cfg = engine_config(str(Path(tmp) / "models"), args.max_num_seqs)
    direct = await in_process(cfg, True, args.rate, int(args.rate * args.duration), args.stream_tokens)
    return await served_round(
        args,
        direct.summary()["total_p50_ms"],
        Served(
            str(Path(tmp) / f"local-{index}"), "--max-num-seqs", str(args.max_num_seqs), "--engine-process"
        ),
    )


async def served_round(
    args: argparse.Namespace, direct_total_p50_ms: float, served: Served
) -> dict[str, float]:
    """The gateway half of a round: streams through `served`, which is stopped after."""
    n = int(args.rate * args.duration)
    poster = Poster(served, args.client)
    paired: list[float] = []
    try:
        model = (await poster.pool.request("GET", "/v1/models")).json()["data"][0]["id"]
        gateway = await through_gateway(poster, served, model, args.rate, n, args.stream_tokens, True, paired)
    finally:
        await poster.close()
        served.stop()
    return {
        "inproc_stream_total_p50_ms": direct_total_p50_ms,
        "gateway_stream_first_p50_ms": gateway.summary()["first_p50_ms"],
        "gateway_stream_total_p50_ms": gateway.summary()["total_p50_ms"],
        "paired_first_p50_ms": pct(paired, 0.5) * 1e3,
        "gateway_cpu_ms_per_request": gateway.summary()["cpu_ms_per_request"],
    }


async def remote_round(args: argparse.Namespace, tmp: str, arm: str, index: int) -> dict[str, float]:
    """One measurement of where the engine runs: called directly, then through `fairserve serve`."""
    if arm == "local":
        return await local_round(args, tmp, index)
    key_file = Path(tmp) / "cluster_key"
    keyed = ("--cluster-key", str(key_file)) if arm == "curve" else ()
    engine = EngineServerProcess(str(Path(tmp) / "models"), "--max-num-seqs", str(args.max_num_seqs), *keyed)
    try:
        client = RemoteEngine(
            engine.address,
            GatewaySettings().engine_silence(),
            cluster_key=ClusterKey.load(key_file) if keyed else None,
        )
        direct = await in_process(
            engine_config("", args.max_num_seqs),
            True,
            args.rate,
            int(args.rate * args.duration),
            args.stream_tokens,
            engine=client,
        )
        return await served_round(
            args,
            direct.summary()["total_p50_ms"],
            Served(str(Path(tmp) / f"{arm}-{index}"), "--engine", engine.address, *keyed),
        )
    finally:
        engine.stop()


async def remote_ab(args: argparse.Namespace) -> dict[str, object]:
    """The local process engine against a `fairserve engine` over TCP, alternating; ratio remote / local."""
    return await alternate(args, args.remote_ab, ("remote", "local"), remote_round)


async def curve_ab(args: argparse.Namespace) -> dict[str, object]:
    """A remote engine with a cluster key against one without, alternating; ratio curve / plain."""
    return await alternate(args, args.curve_ab, ("curve", "plain"), remote_round)


Round = Callable[[argparse.Namespace, str, str, int], Awaitable[dict[str, float]]]


async def alternate(
    args: argparse.Namespace, n_rounds: int, arms: tuple[str, str], one: Round
) -> dict[str, object]:
    """`n_rounds` of each arm in the order a, b, b, a, ...; medians per arm and the ratio a / b."""
    a, b = arms
    rounds: dict[str, list[dict[str, float]]] = {a: [], b: []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(n_rounds):
            for arm in arms if i % 2 == 0 else arms[::-1]:
                rounds[arm].append(await one(args, tmp, arm, i))
    medians = {t: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for t, rs in rounds.items()}
    ratio = {k: medians[a][k] / medians[b][k] for k in medians[a] if medians[b][k]}  # a count of 0: no ratio
    return {
        "rate": args.rate,
        "requests_per_round": int(args.rate * args.duration),
        "rounds": rounds,
        "median": medians,
        f"ratio_{a}_over_{b}": ratio,
    }


class EngineServerProcess:
    """`fairserve engine --listen tcp://127.0.0.1:0` in a subprocess; parses its banner for the address."""

    def __init__(self, cache_dir: str, *args: str) -> None:
        cmd = [
            sys.executable,
            "-m",
            "gateway.cli",
            "engine",
            "--listen",
            "tcp://127.0.0.1:0",
            "--cache-dir",
            cache_dir,
            *args,
        ]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        banner: dict[str, str] = {}
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            key, sep, value = line.strip().partition(": ")
            if sep and key in ("engine", "engine_id"):
                banner[key] = value
            if key == "engine_id":
                break
        if "engine_id" not in banner:
            self.proc.kill()
            raise RuntimeError("fairserve engine did not start")
        self.address = banner["engine"]
        # Keep reading its log, so a chatty engine never blocks on a full pipe mid-measurement.
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def stop(self) -> None:
        """SIGTERM (it drains) and wait."""
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
