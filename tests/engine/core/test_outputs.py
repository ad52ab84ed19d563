"""TokenPrefix: a snapshot of the tokens so far that stays put while its list grows, and reads like a list."""

from __future__ import annotations

import pickle

import pytest

from engine.core.outputs import OutputDelta, RequestMetrics, TokenPrefix
from engine.core.request import FinishReason


def test_a_prefix_is_a_snapshot_of_a_growing_list() -> None:
    ids = [5, 6, 7]
    early = TokenPrefix(ids, len(ids))
    ids += [8, 9]
    late = TokenPrefix(ids, len(ids))
    want = [5, 6, 7]
    assert early == want and want == early and list(early) == want  # a list on either side
    assert late == [5, 6, 7, 8, 9] and late != early and early != [5, 6, 7, 8]
    assert len(early) == 3 and early[-1] == 7 and early[0] == 5 and early[1:] == [6, 7]
    assert 8 not in early and 8 in late and early.index(6) == 1
    with pytest.raises(IndexError):
        early[3]
    with pytest.raises(IndexError):
        early[-4]
    assert repr(early) == "[5, 6, 7]" and early != "567"


def test_a_prefix_pickles_as_the_list_it_stands_for() -> None:
    ids = [1, 2, 3, 4]
    prefix = TokenPrefix(ids, 2)
    copied = pickle.loads(pickle.dumps(prefix))
    assert type(copied) is list and copied == [1, 2]


def test_deltas_and_metrics_pickle_field_for_field() -> None:
    """The worker pickles these every step; their compact __reduce__ must keep every field."""
    metrics = RequestMetrics(16, 4, 3, 6.5, 1, 2, 1, "decode", 1.0, 2.0, None, 4.0)
    delta = OutputDelta("r1", [5, 6], "ab", True, FinishReason.STOP, metrics)
    back = pickle.loads(pickle.dumps(delta, protocol=pickle.HIGHEST_PROTOCOL))
    assert back == delta and back.metrics == metrics and back.finish_reason is FinishReason.STOP


def test_a_report_crosses_the_zmq_wire_field_for_field() -> None:
    """The ZeroMQ transport msgspec-encodes every report: each field of each delta, the stats and traces come back."""
    import msgspec

    from engine.core.outputs import EngineStats
    from engine.core.trace import IterationTrace
    from engine.serving.boundary.messages import FromEngine, IterationReport

    metrics = RequestMetrics(16, 4, 3, 6.5, 1, 2, 1, "decode", 1.0, 2.0, None, 4.0)
    report = IterationReport(
        [
            OutputDelta("r1", [5, 6], "ab", True, FinishReason.STOP, metrics),
            OutputDelta("r2", [], "", False, None, metrics),
        ],
        EngineStats(waiting=3, service={"t": 1.5}, waiting_by_tenant={"t": 3}),
        [IterationTrace(7, 1.0, 1, 2, 3, 4, 5, 6, 0, 1, 0.01, forward_s=0.5)],
    )
    back = msgspec.msgpack.Decoder(FromEngine).decode(msgspec.msgpack.encode(report))
    assert back == report and back.outputs[0].finish_reason is FinishReason.STOP
    assert back.outputs[0].metrics.cancel_state == "decode" and back.stats.service == {"t": 1.5}


def test_a_front_decodes_a_reports_stats_and_traces_when_asked_and_keeps_the_latest() -> None:
    """The front's channel leaves a report's stats and traces as msgpack (ReportAsRead); `stats()` reads the
    latest report's snapshot, `recent_traces` every trace in order, as if each report had been decoded whole."""
    import msgspec

    from engine.core.outputs import EngineStats
    from engine.core.trace import IterationTrace
    from engine.serving.boundary.front import EngineFront
    from engine.serving.boundary.messages import FromEngineAsRead, IterationReport, ReportAsRead

    def trace(i: int) -> IterationTrace:
        return IterationTrace(i, 1.0, 1, 2, 3, 4, 5, 6, 0, 1, 0.01)

    reports = [
        IterationReport([], EngineStats(waiting=3, service={"t": 1.5}), [trace(7)]),
        IterationReport([], EngineStats(waiting=5), []),
        IterationReport([], EngineStats(running=2, running_by_tenant={"t": 2}), [trace(8), trace(9)]),
    ]
    decoder = msgspec.msgpack.Decoder(FromEngineAsRead)
    front = EngineFront()
    front._alive = True
    read = decoder.decode(msgspec.msgpack.encode(reports[0]))
    assert isinstance(read, ReportAsRead)
    front._dispatch(read)
    assert front.stats() == EngineStats(waiting=3, service={"t": 1.5})
    for report in reports[1:]:
        front._dispatch(decoder.decode(msgspec.msgpack.encode(report)))
    assert front.stats() == reports[2].stats and front.stats() == reports[2].stats  # decoded once, then kept
    assert front.recent_traces(10) == [trace(7), trace(8), trace(9)]
    assert front.recent_traces(2) == [trace(8), trace(9)]
