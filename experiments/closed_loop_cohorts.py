"""Closed-loop tenants of identical requests lock into cohorts: weights 4:1 come out 3:1 in fairserve's engine.

In-process, no HTTP: the embedded model's `LLMEngine` at 8 seats, tenant A's 12 clients at weight 4 and
B's 24 at weight 1, every request 24 prompt tokens and 32 output tokens. A finished request's client sends
its next one `--delay` steps later (a round trip through a gateway). With no delay A:B is 4:1; with a delay
the requests that started together end together, A's waiting cohort takes 6 seats, B the other 2, and A's
returning cohort finds them taken: A holds 6 of 8 every step (3:1), and each time its queue empties the VTC
lift takes back the debt it was owed (docs/fairness.md, "Lifting").

    .venv/bin/python -m experiments.closed_loop_cohorts --delay 0
    .venv/bin/python -m experiments.closed_loop_cohorts --delay 3
"""

from __future__ import annotations

import argparse
import collections
import itertools
import random
import sys

from engine.config import EngineConfig
from engine.core.request import RequestMeta
from engine.core.sampling_params import SamplingParams
from engine.serving.llm_engine import LLMEngine

WEIGHTS = {"A": 4.0, "B": 1.0}
CLIENTS = {"A": 12, "B": 24}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.closed_loop_cohorts", description=__doc__)
    p.add_argument("--delay", type=int, default=3, help="steps between a request's end and its client's next")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    rng = random.Random(a.seed)
    engine = LLMEngine(EngineConfig(max_num_seqs=8))
    ids = itertools.count()
    owner: dict[str, str] = {}
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)

    def send(tenant: str) -> None:
        request_id = f"{tenant}{next(ids)}"
        owner[request_id] = tenant
        prompt = [rng.randrange(32, 127) for _ in range(24)]
        engine.add_request(request_id, prompt, params, RequestMeta(tenant_id=tenant, weight=WEIGHTS[tenant]))

    for tenant, n in CLIENTS.items():
        for _ in range(n):
            send(tenant)
    returning: dict[int, list[str]] = collections.defaultdict(list)
    tokens: collections.Counter[str] = collections.Counter()
    seats: collections.Counter[tuple[int, int]] = collections.Counter()
    for step in range(a.steps):
        for tenant in returning.pop(step, []):
            send(tenant)
        measured = step > a.steps // 4  # after the start's transient
        if measured:
            running = collections.Counter(owner[r.request_id] for r in engine.scheduler.running)
            seats[(running["A"], running["B"])] += 1
        for out in engine.step():
            tenant = owner[out.request_id]
            if measured:
                tokens[tenant] += len(out.new_token_ids)
            if out.finished:
                returning[step + 1 + a.delay].append(tenant)
    print(
        f"delay {a.delay} steps: A:B tokens {tokens['A']}:{tokens['B']}, over 4:1 {tokens['A'] / tokens['B'] / 4:.3f}"
    )
    print("seats (A, B) held, steps:", seats.most_common(4))
    return 0


if __name__ == "__main__":
    sys.exit(main())
