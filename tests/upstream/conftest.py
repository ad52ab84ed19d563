"""The peer engines' fixtures (tests/peers/fixtures.py) for the upstream tests."""

from tests.peers.fixtures import transformers_engine

__all__ = ["transformers_engine"]
