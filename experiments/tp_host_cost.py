"""What tensor parallelism costs rank 0 per step, and the memory each rank holds, TP=2 against TP=1.

    python -m experiments.tp_host_cost                 # 6 alternating rounds; markdown on stdout
    python -m experiments.tp_host_cost --rounds 10 --batch 32

A 2-layer, 64-wide seeded Llama (byte tokenizer; 4 heads, 2 KV heads) on CPU, so the host shows beside
the forward. Both engines stay up; each round runs the same decode-heavy batch on one then the other,
the first side swapped every round (absolute times drift on a shared VM; the ratio is the figure). Per
step: the median wall time of `LLMEngine.step()` in decode steady state; under TP=2 the median time
rank 0 spends handing the step to the other rank (`StepPeers.send_step`: the flat inputs as one int64
array and one pipe write per rank; the write wakes that rank, and on a loaded 2-core VM the writer may
lose its core to it, which this figure includes), building the message timed alone, and its size.
The step time under TP=2 also holds the gloo all-reduces (two per layer, the embedding's, the logits'
all-gather), each a rendezvous of two processes sharing the cores: on a CPU that is the cost of the
collectives, not a speed-up. Memory: parameter bytes on rank 0.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from engine.config import EngineConfig
from engine.core.byte_tokenizer import BYTE_SPECIAL_TOKENS
from engine.core.sampling_params import SamplingParams
from engine.serving.llm_engine import LLMEngine
from engine.worker.host_batch import HostBatch
from engine.worker.loader import default_model_config, write_seeded_llama
from engine.worker.rank_steps import StepPeers, step_payload

GEOMETRY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
GEOMETRY |= {"num_key_value_heads": 2, "head_dim": 16}


class TimedPeers:
    """Wraps a StepPeers' send_step to record its seconds and message bytes."""

    def __init__(self, peers: StepPeers) -> None:
        self.peers, self.seconds, self.sizes = peers, list[float](), list[int]()
        self.build_seconds: list[float] = []
        self._send = peers.send_step
        peers.send_step = self.send_step  # type: ignore[method-assign]

    def send_step(self, batch: HostBatch, ids: Any) -> None:
        t0 = time.perf_counter()
        self._send(batch, ids)
        t1 = time.perf_counter()
        self.sizes.append(len(step_payload(batch, ids)))  # built again, timed alone
        self.seconds.append(t1 - t0)
        self.build_seconds.append(time.perf_counter() - t1)


def decode_steps(engine: LLMEngine, batch: int, tokens: int, tag: str) -> list[float]:
    """Seconds of each decode steady-state step of `batch` requests generating `tokens` each."""
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"{tag}-{i}", [(7 * i + j) % 256 for j in range(16)], params)
    seconds = []
    while engine.has_unfinished():
        t0 = time.perf_counter()
        engine.step()
        trace = engine.traces[-1]
        if trace.prefill_tokens == 0 and trace.decode_tokens == batch:
            seconds.append(time.perf_counter() - t0)
    return seconds


def param_bytes(engine: LLMEngine) -> int:
    return sum(p.numel() * p.element_size() for p in engine.loaded.model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "model"
        write_seeded_llama(root, default_model_config(256 + len(BYTE_SPECIAL_TOKENS)) | GEOMETRY)
        engines = {
            tp: LLMEngine(EngineConfig(model=str(root), num_kv_blocks=256, tensor_parallel_size=tp))
            for tp in (1, 2)
        }
        peers = engines[2].peers
        assert peers is not None
        timed = TimedPeers(peers)
        steps: dict[int, list[float]] = {1: [], 2: []}
        try:
            for r in range(args.rounds):
                for tp in (1, 2) if r % 2 == 0 else (2, 1):
                    steps[tp].append(
                        statistics.median(decode_steps(engines[tp], args.batch, args.tokens, f"r{r}"))
                    )
            memory = {tp: param_bytes(engine) for tp, engine in engines.items()}
        finally:
            for engine in engines.values():
                engine.close()
    one, two = statistics.median(steps[1]), statistics.median(steps[2])
    send = statistics.median(timed.seconds)
    print(
        f"batch {args.batch}, {args.rounds} alternating rounds, median of per-round medians (decode steps)\n"
    )
    print("| | TP=1 | TP=2 | TP=2 / TP=1 |\n|---|---|---|---|")
    print(f"| step wall time (µs) | {one * 1e6:.0f} | {two * 1e6:.0f} | {two / one:.2f} |")
    print(f"| rank 0 handing the step over (µs) | 0 | {send * 1e6:.1f} | {send / one:.3f} of a TP=1 step |")
    build = statistics.median(timed.build_seconds)
    print(f"| of which building the message (µs) | - | {build * 1e6:.1f} | |")
    print(f"| step message (bytes) | - | {statistics.median(timed.sizes):.0f} | |")
    print(f"| parameter bytes on rank 0 | {memory[1]} | {memory[2]} | {memory[2] / memory[1]:.3f} |")


if __name__ == "__main__":
    main()
