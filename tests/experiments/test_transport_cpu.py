"""experiments.transport_cpu: frames survive being split anywhere; every transport answers every client."""

from __future__ import annotations

import pytest
import uvloop

from experiments.transport_cpu import CHANNELS, framed, measure, unframe


def test_a_partial_frame_waits_for_the_rest() -> None:
    wire = framed([b"first", b"", b"x" * 300])
    buf = bytearray(wire[:12])
    assert unframe(buf) == [b"first"]
    buf += wire[12:]
    assert unframe(buf) == [b"", b"x" * 300]
    assert buf == bytearray()


@pytest.mark.parametrize("kind", sorted(CHANNELS))
def test_every_round_trip_comes_back(kind: str) -> None:
    got = uvloop.run(measure(kind, trips=200, clients=4))
    assert 1 <= got["per_report"] <= 4  # each report answered between one and every client in flight
