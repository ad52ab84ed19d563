"""The peer engines' fixtures, for the tests of this directory."""

from tests.peers.fixtures import transformers_engine, vllm_sim

__all__ = ["transformers_engine", "vllm_sim"]
