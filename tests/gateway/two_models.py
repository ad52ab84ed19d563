"""Two locally built models of different speed for the tests: the deadline bench's own (bench/deadlines.py),
built as the default model is (a seeded random Llama and the byte tokenizer)."""

from bench.deadlines import TWO_MODELS, build_model

__all__ = ["TWO_MODELS", "build_model"]
