"""The live `fairserve serve` fixture the experiments' client tests share with tests/bench."""

from tests.bench.conftest import live_server

__all__ = ["live_server"]
