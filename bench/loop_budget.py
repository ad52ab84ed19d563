"""What the event loop's bounded work costs at its bounds (docs/gateway.md, "The event loop's budget").

    .venv/bin/python -m bench.loop_budget              # best and median of 20 runs each
    .venv/bin/python -m bench.loop_budget --runs 1     # the test's run

Times, in this process and without a server, each piece of work the gateway does on its event loop at the
bound that keeps it there: counting a huge chat before validating it, validating a chat at the message cap,
encoding the longest prompt tokenised inline, rendering a chat at the cap, and validating a token-id
prompt of 300,000 ids (the one list not capped at 2,048 entries).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.harness import parser
from engine.core.tokenizer import Tokenizer
from engine.worker.loader import default_model_dir
from gateway.edge.errors import APIError
from gateway.openai.parsing import TOKENIZE_INLINE_CHARS, parse_body
from gateway.settings import GatewaySettings

CAP = GatewaySettings.model_fields["max_chat_messages"].default


def _timed(work: Callable[[], object], runs: int) -> dict[str, float]:
    took = []
    for _ in range(runs):
        start = time.perf_counter()
        with contextlib.suppress(APIError):  # refused: the refusal is the work timed
            work()
        took.append(time.perf_counter() - start)
    return {"best_ms": round(min(took) * 1e3, 2), "median_ms": round(statistics.median(took) * 1e3, 2)}


def _body(**fields: Any) -> bytes:
    return json.dumps({"model": "m", "max_tokens": 1, **fields}).encode()


def run(runs: int) -> dict[str, dict[str, float]]:
    """Each piece of loop work at its bound: best and median milliseconds over `runs`."""
    tok = Tokenizer.from_dir(default_model_dir())
    empty = {"role": "user", "content": ""}
    flood, at_cap = _body(messages=[empty] * 30_000), _body(messages=[empty] * CAP)
    parts = _body(messages=[{"role": "user", "content": [{"type": "text", "text": ""}] * CAP}])
    ids = _body(prompt=[1] * 300_000)
    text, chat = "a" * TOKENIZE_INLINE_CHARS, [empty] * CAP
    return {
        "count_and_refuse_30000_messages": _timed(lambda: parse_body(flood, True, CAP), runs),
        "validate_messages_at_cap": _timed(lambda: parse_body(at_cap, True, CAP), runs),
        "validate_text_parts_at_cap": _timed(lambda: parse_body(parts, True, CAP), runs),
        "encode_inline_bound": _timed(lambda: tok.encode(text), runs),
        "render_messages_at_cap": _timed(lambda: tok.apply_chat_template(chat), runs),
        "validate_300000_token_ids": _timed(lambda: parse_body(ids, False, CAP), max(1, runs // 4)),
    }


def main(argv: list[str] | None = None) -> int:
    """Run and print the JSON report."""
    p = parser(__doc__, runs=(20, "runs of each piece"))
    p.prog = "python -m bench.loop_budget"
    print(json.dumps(run(p.parse_args(argv).runs), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
