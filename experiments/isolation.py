"""Isolation benchmark: a tenant's time per output token beside a neighbour's heaviest allowed request.

    python -m experiments.isolation [--rounds 6] [--victim-tokens 48]

One gateway over the process engine (the default deployment). Each round measures the victim's
stream (its time per output token, TPOT, from the HTTP stream's first to last token) in three
conditions, in an order that rotates every round so drift of this VM's speed hits all three alike:

* solo:  the victim alone;
* plain: beside a neighbour request of the same prompt and length without heavy parameters;
* heavy: beside the same neighbour request carrying everything the caps allow (engine/core/limits.py):
  16 stop strings of 256 characters, 300 logit_bias entries, 64 stop_token_ids.

Reported: heavy/plain (what the neighbour's parameters cost the victim: isolation, target <= 1.3)
and plain/solo (what any neighbour's tokens cost on this CPU: batching, not isolation).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.server import LocalServer, start_local_server
from engine import EngineConfig, ProcessEngine
from engine.core.limits import RequestCaps

CONDITIONS = ("solo", "plain", "heavy")


def heavy_parameters(caps: RequestCaps, vocab_size: int) -> dict[str, Any]:
    """The heaviest host work one request may ask for within the caps (and the vocabulary)."""
    # Stop strings that keep matching the start of typical output, so the matcher walks partial matches.
    stops = [
        ("e " * caps.max_stop_chars)[: caps.max_stop_chars - 1] + chr(0x4E00 + i)
        for i in range(caps.max_stop_strings)
    ]
    stop_ids = list(range(vocab_size - caps.max_stop_token_ids, vocab_size))
    bias = {str(t): 0.01 for t in range(min(caps.max_logit_bias, vocab_size))}
    bias.update({str(t): -100.0 for t in stop_ids if str(t) in bias})  # the stop ids are never sampled
    return {"stop": stops, "logit_bias": bias, "stop_token_ids": stop_ids}


def stream_tpot(
    server: LocalServer, tenant: str, body: dict[str, Any], started: threading.Event | None = None
) -> tuple[float, int]:
    """(seconds per output token after the first, tokens) of one streamed completion."""
    stamps: list[float] = []
    try:
        with (
            httpx.Client(base_url=server.url, timeout=300) as client,
            client.stream(
                "POST",
                "/v1/completions",
                json={"model": server.model, "stream": True, **body},
                headers={"Authorization": f"Bearer {server.keys[tenant]}"},
            ) as resp,
        ):
            if resp.status_code != 200:
                raise RuntimeError(f"{tenant}: {resp.status_code} {resp.read()!r}")
            for line in resp.iter_lines():
                if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                    stamps.append(time.perf_counter())
                    if started is not None:
                        started.set()
    finally:
        if started is not None:
            started.set()
    return ((stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else 0.0), len(stamps)


def one(server: LocalServer, condition: str, victim_tokens: int, heavy: dict[str, Any]) -> float:
    """The victim's TPOT in one condition."""
    victim = {
        "prompt": "The victim streams a story about rivers.",
        "max_tokens": victim_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
    }
    if condition == "solo":
        return stream_tpot(server, "victim", victim)[0]
    neighbour = {
        "prompt": "The neighbour writes an essay about mountains. " * 8,
        "max_tokens": victim_tokens * 2,
        "ignore_eos": True,
        "temperature": 0.8,
        "seed": 1,
        **(heavy if condition == "heavy" else {}),
    }
    started = threading.Event()
    thread = threading.Thread(target=stream_tpot, args=(server, "neighbour", neighbour, started), daemon=True)
    thread.start()
    started.wait(120)  # the neighbour is decoding before the victim starts
    tpot = stream_tpot(server, "victim", victim)[0]
    thread.join(300)
    return tpot


def run(rounds: int, victim_tokens: int) -> dict[str, Any]:
    """Alternate the three conditions for `rounds` rounds; medians and the two ratios."""
    config = EngineConfig(max_num_seqs=8)
    engine = ProcessEngine(config)
    engine.start()
    with tempfile.TemporaryDirectory() as data:
        server = start_local_server(config, Path(data), [("victim", 1.0), ("neighbour", 1.0)], engine=engine)
        try:
            heavy = heavy_parameters(config.caps, engine.tokenizer.vocab_size)
            one(server, "plain", 8, heavy)  # warm-up: first-request costs are nobody's condition
            samples: dict[str, list[float]] = {c: [] for c in CONDITIONS}
            for r in range(rounds):
                order = CONDITIONS[r % 3 :] + CONDITIONS[: r % 3]
                for condition in order:
                    samples[condition].append(one(server, condition, victim_tokens, heavy))
        finally:
            server.stop()
    med = {c: statistics.median(v) for c, v in samples.items()}
    return {
        "rounds": rounds,
        "victim_tokens": victim_tokens,
        "tpot_ms_median": {c: round(v * 1e3, 2) for c, v in med.items()},
        "tpot_ms_all": {c: [round(x * 1e3, 2) for x in v] for c, v in samples.items()},
        "heavy_over_plain": round(med["heavy"] / med["plain"], 3),
        "plain_over_solo": round(med["plain"] / med["solo"], 3),
    }


def main() -> None:
    """Run and print JSON."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=6, help="rounds of the three conditions (order rotates)")
    p.add_argument("--victim-tokens", type=int, default=48, help="tokens the victim streams per measurement")
    args = p.parse_args()
    print(json.dumps(run(args.rounds, args.victim_tokens), indent=2))


if __name__ == "__main__":
    main()
