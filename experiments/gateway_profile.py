"""Sort py-spy's collapsed stacks of the gateway into the request path's stages, as µs per request.

    .venv/bin/python -m bench.gateway_cpu --rounds 1 --requests 3000 --profile /tmp/prof
    .venv/bin/python -m experiments.gateway_profile /tmp/prof/fairserve-nonstream-0.txt 0.55
    .venv/bin/python -m experiments.gateway_profile /tmp/prof/fairserve-stream-0.txt 5.24 --leaves 15

Each sample goes to the stage of its innermost frame that names one (walking from the leaf to the root),
so `json.dumps` called from the response builder counts as response building and the event loop's own
frames count as HTTP and ASGI. The shares are scaled to the CPU per request that bench.gateway_cpu
measured without the profiler (the second argument, ms). With `--leaves N` the N innermost frames that
took the most samples follow the table: where the time is spent, not which stage spent it (a C call such as
a socket write shows as the Python frame that made it; the event loop's own C as `Runner.run`).
"""

from __future__ import annotations

import sys
from collections import Counter

# (stage, fragments of a frame's "function (file:line)") in no particular order: the innermost match wins.
STAGES: list[tuple[str, tuple[str, ...]]] = [
    ("auth and key cache", ("gateway/edge/auth", "billing/key_cache", "gateway/edge/connections", "billing/keys")),
    ("admission and quota", ("admission/", "refusal_budget", "gateway/openai/refusals")),
    ("idempotency", ("gateway/idempotency/",)),
    ("ledger row and journal", ("billing/journal", "Ledger.record", "encode_line", "encode_row", "usage_record",
                                "_record (gateway")),
    ("ledger SQL writer (its thread)", ("billing/", "sqlalchemy", "sqlite3")),
    ("metrics", ("gateway/ops/metrics", "prometheus_client", "_observe")),
    ("tracing", ("gateway/ops/tracing", "opentelemetry")),
    ("response building, JSON, detokenizing", ("gateway/openai/format", "gateway/openai/responses",
                                              "gateway/openai/runs", "Detokenizer", ".detokenizer")),
    ("parsing and validation", ("parsing.py", "schemas.py", "pydantic", "engine/core/tokenizer", "tokenizers",
                                "engine/core/limits", "read_request", "RequestContext", "engine/core/request.py")),
    ("engine boundary", ("engine/serving/boundary/", "zmq", "msgspec", "routing/")),
    ("request path glue", ("gateway/openai/generation", "gateway/openai/context", "gateway/openai/submit",
                           "gateway/openai/routes")),
    ("HTTP: uvicorn's send (the socket write)", ("RequestResponseCycle.send",)),
    ("HTTP: the event loop's own C (uvloop: reads, callbacks)", ("Runner.run (asyncio",)),
    ("HTTP and ASGI", ("uvicorn", "starlette", "httptools", "gateway/edge/middleware", "asyncio", "uvloop")),
]  # fmt: skip


# Leaves py-spy counts as active that are a thread waiting for work: not the requests' CPU, left out.
IDLE = ("concurrent/futures/thread.py:81", "Event.wait (threading", "Condition.wait (threading")


def stage_of(stack: str) -> str:
    """The stage of one collapsed stack (frames root first, `;`-separated); "idle" for a waiting thread."""
    if any(mark in stack for mark in IDLE):
        return "idle"
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
        if stack and (stage := stage_of(stack)) != "idle":
            counts[stage] += int(n)
    return counts


def leaves(path: str) -> Counter[str]:
    """Samples per innermost frame (its function and file, without the line), waiting threads left out."""
    counts: Counter[str] = Counter()
    with open(path) as stacks:
        for line in stacks.read().splitlines():
            stack, _, n = line.rstrip().rpartition(" ")
            if stack and stage_of(stack) != "idle":
                function, _, where = stack.rpartition(";")[2].partition(" (")
                counts[f"{function} ({where.rpartition(':')[0]})"] += int(n)
    return counts


def main() -> None:
    """Print a Markdown table: stage, share of samples, µs per request; with `--leaves N`, the top frames."""
    args = [a for a in sys.argv[1:] if a != "--leaves"]
    top = int(args.pop()) if "--leaves" in sys.argv[1:] else 0
    counts = stages(args[0])
    ms = float(args[1]) if len(args) > 1 else 0.0
    total = sum(counts.values())
    print("| stage | share | µs per request |\n|---|---|---|")
    for stage, n in counts.most_common():
        print(f"| {stage} | {n / total:.1%} | {n / total * ms * 1e3:.0f} |")
    if top:
        frames = leaves(args[0])
        print("\n| innermost frame | share | µs per request |\n|---|---|---|")
        for frame, n in frames.most_common(top):
            print(f"| `{frame}` | {n / total:.1%} | {n / total * ms * 1e3:.0f} |")


if __name__ == "__main__":
    main()
