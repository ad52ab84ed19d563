"""GrammarConfig: the knobs of constrained decoding, with their defaults (docs/engine.md, "Grammars")."""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field


class GrammarConfig(BaseModel):
    """How grammar work is bounded and charged; every default is documented in docs/engine.md."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    compile_timeout_s: float = Field(
        default=5.0,
        gt=0,
        le=60,
        allow_inf_nan=False,
        description="a grammar not compiled within this many seconds fails its request with a 400",
    )
    # Compiles run beside the engine loop, which every tenant's steps wait on: by default they leave it a core.
    compile_threads: int = Field(
        default=0, ge=0, le=64, description="threads compiling grammars; 0: the cores less one, at least one"
    )

    @property
    def compile_slots(self) -> int:
        """`compile_threads`, or for 0 the cores less one (at least one)."""
        return self.compile_threads or max(1, (os.cpu_count() or 1) - 1)

    max_compiles_per_tenant: int = Field(
        default=1,
        ge=1,
        description="grammars one tenant may have compiling at once; its others wait (holding no batch seat)",
    )
    cache_entries: int = Field(default=512, ge=1, description="compiled grammars kept, by grammar hash")
    # Mask CPU time as service: this many microseconds of it are charged as one prefill token (w_in). The
    # default is llguidance's published p50 mask time on JSON-schema benchmarks, so a typical masked token
    # costs its tenant about one prefill token more than an unconstrained one (docs/fairness.md).
    mask_us_per_token: float = Field(
        default=50.0,
        gt=0,
        allow_inf_nan=False,
        description="microseconds of grammar CPU (compile and masks) charged as one prefill token of service",
    )
    # llguidance's per-mask bounds (LLParserLimits): lexer fuel (~14k/ms) and Earley items (~20k/ms) one mask
    # may spend. A mask over them fails its own request; so one mask costs at most a few milliseconds.
    step_lexer_fuel: int = Field(default=50_000, ge=1_000, description="lexer fuel one mask may use")
    step_max_items: int = Field(default=20_000, ge=1_000, description="Earley items one mask may create")
