"""No request holds the event loop (#45): four clients flooding 30,000-message chats (990 KB each, under
the body cap) at a real `fairserve serve` hold no event-loop callback long, and leave another tenant its
answers.

Before the fix each such chat held the loop for 0.28 s on an idle machine (validated, templated and
encoded inline) and the other tenant kept 0.11-0.18 of its answers (`python -m bench.door --floods
messages`, docs/gateway.md "The event loop's budget"). Now one costs the server about 3.5 ms of CPU.

What is asserted: the server runs with `--loop-debug` at a 100 ms budget, and at most one in ten of the
flood's chats may show up as a slow callback of the chat route (before the fix every one did; on the shared
2-core machine at a load average of 16, one callback in 40 still stretched past 30 ms when the kernel or
another thread held the loop's thread); and the issue's bound, the tenant's answers beside the flood at
least 0.7 of its answers alone (phases alone and beside the flood alternate, median of five pairs). The
bench measured 0.74-1.03 after, against 0.11-0.18 before. That ratio is the machine's to give as much as
the server's, so the test runs in the serial part, alone: the suite's other worker would take the CPU the
tenant's answers need.
"""

from __future__ import annotations

import pytest

from bench.door import run


@pytest.mark.serial
def test_a_flood_of_huge_chats_holds_no_callback_and_leaves_another_tenant_its_answers() -> None:
    result = run(2.0, 5, ("messages",), "--loop-debug", "--loop-budget-ms", "100")
    flood = result["messages"]
    refused = flood["flood"].get("400", 0)
    assert refused > 0 and "200" not in flood["flood"], flood  # refused, never served
    assert flood["success_rate"] == 1.0, flood
    slow = [line for line in result["slow_callbacks"] if "/v1/chat/completions" in line]
    assert len(slow) * 10 <= refused, (refused, slow)
    assert flood["answers_ratio"] >= 0.7, result
