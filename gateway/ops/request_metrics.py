"""The per-request metrics (latency histograms, requests, tokens, charged service, cancel lag) as plain numbers,
written out by prometheus_client when /metrics is scraped.

Why the request path holds its own counters: prometheus_client's `Counter.inc` and `Histogram.observe` each
take a lock and make 3-5 Python calls, and a finished request made twelve of them (39 calls into the library
per non-streaming request: docs/gateway.md, "The path's length, counted"). Here a finished request costs a
few float additions and, per latency, one `bisect` into a list of bucket counts. No lock: every update runs
on the event loop's thread (`GatewayMetrics.observe_finished` and `count_request`, called only from
gateway/openai/submit.py's `_observe`, a done-callback of the run's outcome future, which asyncio runs on the
loop). prometheus_client keeps the exposition (HELP, TYPE, `_created`, escaping, the text and OpenMetrics
formats) through `RequestCollector`, the way `_EngineCollector` reads engine stats at scrape time.

A scrape may run on another thread (`--metrics-port` serves from prometheus_client's own): it copies each
dict and list first (a single C call under the GIL), so a new row appearing mid-scrape cannot break the
iteration. As with prometheus_client's own histogram, a scrape racing an observation may see its bucket
before its sum; `_count` is the +Inf bucket, so count and buckets always agree.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterator

from prometheus_client import metrics as prom_metrics
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import INF, floatToGoString

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_BOUNDS = (*LATENCY_BUCKETS, INF)
_go_string: Callable[[float], str] = floatToGoString  # untyped in prometheus_client
_LE = tuple(_go_string(b) for b in _BOUNDS)  # the `le` labels, as prometheus_client writes them
# (name, HELP) of the tenant-labelled histograms, in the order they are exposed.
_HISTOGRAMS = (
    ("fairserve_ttft_seconds", "Time to first token"),
    ("fairserve_tpot_seconds", "Time per output token after the first"),
    ("fairserve_e2e_seconds", "Arrival to last token"),
    ("fairserve_queue_seconds", "Arrival to first scheduled"),
)
_TOKEN_KINDS = ("prompt", "cached", "completion")


class Buckets:
    """One histogram child: observations per bucket (not cumulative; `le` semantics, the +Inf bucket last)
    and their sum."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0.0] * len(_BOUNDS)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """Count one observation: the first bucket whose bound is >= value, as prometheus_client does."""
        self.counts[bisect_left(_BOUNDS, value)] += 1.0
        self.sum += value

    def cumulative(self) -> list[tuple[str, float]]:
        """(le, observations <= le) per bucket, as the exposition wants them."""
        out, acc = [], 0.0
        for le, n in zip(_LE, list(self.counts), strict=True):
            acc += n
            out.append((le, acc))
        return out


class TenantRow:
    """One tenant label's numbers of finished engine requests, bound once on its first: the labels are
    bounded (TenantLabels), so the rows are too. `requests` is the label's count per status, shared with
    `RequestCounts.requests`."""

    __slots__ = (
        "label",
        "created",
        "requests",
        "prompt",
        "cached",
        "completion",
        "charged",
        "ttft",
        "tpot",
        "e2e",
        "queue",
    )

    def __init__(self, label: str, requests: dict[str, float]) -> None:
        self.label = label
        self.created = time.time()
        self.requests = requests
        self.prompt = 0.0
        self.cached = 0.0
        self.completion = 0.0
        self.charged = 0.0
        self.ttft = Buckets()
        self.tpot = Buckets()
        self.e2e = Buckets()
        self.queue = Buckets()

    def latencies(self) -> tuple[Buckets, Buckets, Buckets, Buckets]:
        """The histograms in _HISTOGRAMS' order."""
        return self.ttft, self.tpot, self.e2e, self.queue


class RequestCounts:
    """The per-request numbers of one app: a row per tenant label that finished an engine request (made then,
    as prometheus_client's children were), a count per label and status of every ended request, the order
    each (label, status) first appeared in (the exposition keeps it, as prometheus_client kept its children's)
    and the unlabelled cancel lag."""

    def __init__(self) -> None:
        self.rows: dict[str, TenantRow] = {}
        self.requests: dict[str, dict[str, float]] = {}  # label -> status -> requests
        self.statuses: list[tuple[str, str, float]] = []  # (label, status, created)
        self.cancel_lag = 0.0
        self.cancel_lag_created = time.time()

    def row(self, label: str) -> TenantRow:
        """The label's row, made on its first finished engine request."""
        found = self.rows.get(label)
        if found is None:
            found = self.rows[label] = TenantRow(label, self.by_status(label))
        return found

    def by_status(self, label: str) -> dict[str, float]:
        """The label's count per status."""
        found = self.requests.get(label)
        if found is None:
            found = self.requests[label] = {}
        return found

    def first(self, label: str, counts: dict[str, float], status: str) -> None:
        """The first request of this label and status (later ones are one `+=` at the call site)."""
        counts[status] = 1.0  # before the order entry: a scrape on another thread finds its count
        self.statuses.append((label, status, time.time()))


def _created() -> bool:
    """Whether prometheus_client exposes `_created` samples (PROMETHEUS_DISABLE_CREATED_SERIES), read per scrape
    as its own metrics do."""
    return bool(getattr(prom_metrics, "_use_created", True))


class RequestCollector(Collector):
    """Exposes the request path's families, in the order and shape prometheus_client's Counter and Histogram
    gave them (names, HELP, labels, buckets, `_created`); `cancel_lag_only` selects the unlabelled cancel lag,
    registered apart so the families keep their places in the text."""

    def __init__(self, counts: RequestCounts, cancel_lag_only: bool = False) -> None:
        self._counts = counts
        self._cancel_lag_only = cancel_lag_only

    def collect(self) -> Iterator[Metric]:
        created = _created()
        if self._cancel_lag_only:
            c = self._counts
            when = c.cancel_lag_created if created else None
            yield CounterMetricFamily(
                "fairserve_cancel_lag_tokens",
                "Tokens computed after a cancel signal",
                value=c.cancel_lag,
                created=when,
            )
            return
        rows = list(self._counts.rows.values())
        yield from _histograms(rows, created)
        yield _requests(self._counts, created)
        yield from _tokens(rows, created)


def _histograms(rows: list[TenantRow], created: bool) -> Iterator[Metric]:
    families = [HistogramMetricFamily(name, doc, labels=["tenant"]) for name, doc in _HISTOGRAMS]
    for row in rows:
        for family, h in zip(families, row.latencies(), strict=True):
            family.add_metric([row.label], h.cumulative(), h.sum)
            if created:
                family.samples.append(Sample(family.name + "_created", {"tenant": row.label}, row.created))
    yield from families


def _requests(counts: RequestCounts, created: bool) -> Metric:
    family = CounterMetricFamily("fairserve_requests", "Finished requests", labels=["tenant", "status"])
    for label, status, when in list(counts.statuses):
        family.add_metric([label, status], counts.requests[label][status], created=when if created else None)
    return family


def _tokens(rows: list[TenantRow], created: bool) -> Iterator[Metric]:
    tokens = CounterMetricFamily("fairserve_tokens", "Tokens by kind", labels=["tenant", "kind"])
    charged = CounterMetricFamily("fairserve_charged_service", "Charged fairness service", labels=["tenant"])
    for row in rows:
        when = row.created if created else None
        for kind, value in zip(_TOKEN_KINDS, (row.prompt, row.cached, row.completion), strict=True):
            tokens.add_metric([row.label, kind], value, created=when)
        charged.add_metric([row.label], row.charged, created=when)
    yield tokens
    yield charged
