"""Sort py-spy's collapsed stacks of the gateway into the request path's stages, as µs per request.

    .venv/bin/python -m bench.gateway_cpu --rounds 1 --requests 3000 --profile /tmp/prof
    .venv/bin/python -m experiments.gateway_profile /tmp/prof/fairserve-nonstream-0.txt 0.55

Each sample goes to the stage of its innermost frame that names one (walking from the leaf to the root),
so `json.dumps` called from the response builder counts as response building and the event loop's own
frames count as HTTP and ASGI. The shares are scaled to the CPU per request that bench.gateway_cpu
measured without the profiler (the second argument, ms).
"""

from __future__ import annotations

import sys
from collections import Counter

# (stage, fragments of a frame's "function (file:line)") in no particular order: the innermost match wins.
STAGES: list[tuple[str, tuple[str, ...]]] = [
    ("auth and key cache", ("gateway/edge/auth", "billing/key_cache", "gateway/edge/connections", "billing/keys")),
    ("admission and quota", ("admission/", "refusal_budget", "gateway/openai/refusals")),
    ("idempotency", ("gateway/idempotency/",)),
    ("parsing and validation", ("parsing.py", "schemas.py", "pydantic", "engine/tokenizer", "tokenizers",
                                "engine/limits", "read_request", "RequestContext", "engine/request.py")),
    ("engine boundary", ("engine/boundary/", "zmq", "msgspec", "routing/")),
    ("response building and JSON", ("gateway/openai/format", "gateway/openai/responses", "gateway/openai/runs")),
    ("ledger journal", ("billing/",)),
    ("metrics", ("gateway/ops/metrics", "prometheus_client", "_observe")),
    ("tracing", ("gateway/ops/tracing", "opentelemetry")),
    ("request path glue", ("gateway/openai/generation", "gateway/openai/context", "gateway/openai/pipeline",
                           "gateway/openai/stages", "gateway/openai/routes")),
    ("HTTP and ASGI", ("uvicorn", "starlette", "httptools", "gateway/edge/middleware", "asyncio", "uvloop")),
]  # fmt: skip


def stage_of(stack: str) -> str:
    """The stage of one collapsed stack (frames root first, `;`-separated)."""
    for frame in reversed(stack.split(";")):
        for stage, fragments in STAGES:
            if any(f in frame for f in fragments):
                return stage
    return "other"


def stages(path: str) -> Counter[str]:
    """Samples per stage in one py-spy raw file."""
    counts: Counter[str] = Counter()
    with open(path) as stacks:
        lines = stacks.read().splitlines()
    for line in lines:
        stack, _, n = line.rstrip().rpartition(" ")
        if stack:
            counts[stage_of(stack)] += int(n)
    return counts


def main() -> None:
    """Print a Markdown table: stage, share of samples, µs per request."""
    counts = stages(sys.argv[1])
    ms = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    total = sum(counts.values())
    print("| stage | share | µs per request |\n|---|---|---|")
    for stage, n in counts.most_common():
        print(f"| {stage} | {n / total:.1%} | {n / total * ms * 1e3:.0f} |")


if __name__ == "__main__":
    main()
