"""The messages only a remote engine needs, beside engine/serving/boundary/messages.py's: the handshake and the heartbeat.

A gateway says `Hello` and the engine answers `Announce`: everything the gateway needs to validate requests
and name the model without a copy of it (the limits and caps the engine enforces and the tokenizer's own
files, sent as text). The tokenizer travels in the handshake because the front detokenizes and checks
token ids itself (engine/serving/boundary/front.py), and a gateway on another host must not need the model's directory;
it is sent only when asked, so a gateway that rejoins a restarted engine does not fetch megabytes again.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import msgspec

from engine.core.outputs import EngineStats
from engine.core.tokenizer import Tokenizer
from engine.serving.boundary.messages import (
    Abort,
    IterationReport,
    SetWeight,
    Submit,
    SubmitFailed,
    WorkerExiting,
)
from engine.serving.remote.accounting import ProducedRecord, TenantProduced

# The files of a model directory engine.core.tokenizer.Tokenizer.from_dir reads; those present are announced.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "config.json",
    "chat_template.jinja",
)


class Hello(msgspec.Struct, tag=True, array_like=True):
    """A gateway (re)joins: the engine answers with an Announce, with the tokenizer files if asked."""

    gateway_id: str
    want_tokenizer: bool = False


class Ping(msgspec.Struct, tag=True, array_like=True):
    """A gateway's heartbeat: an engine that hears none for `gateway_timeout_s` aborts that gateway's requests."""


class Announce(msgspec.Struct, tag=True, array_like=True):
    """Who the engine is and what a request must fit; a new `engine_id` means a fresh process."""

    engine_id: str
    model_name: str
    max_model_len: int
    vocab_size: int
    block_size: int
    num_kv_blocks: int
    caps: dict[str, int]  # engine.limits.RequestCaps fields (a pydantic model msgspec does not encode)
    stats: EngineStats
    tokenizer_files: dict[str, str] = {}  # file name -> text; empty unless the Hello asked
    role: str = "both"  # prefill, decode or both (engine/serving/remote/roles.py)
    kv_address: str = ""  # a prefill engine's KV server, which decode engines pull from


class Billed(msgspec.Struct, tag=True, array_like=True):
    """A gateway has these requests' rows in its ledger: the engine forgets their records
    (engine/serving/remote/accounting.py)."""

    request_ids: list[str]
    completion_tokens: list[int] = []  # billed for each (a gateway that lost the engine billed fewer)


class AskProduced(msgspec.Struct, tag=True, array_like=True):
    """A gateway asks for the per-tenant totals since `since`, and the records of dead gateways' requests
    finished at least `orphans_after_s` ago (a negative value: none)."""

    since: float
    orphans_after_s: float = -1.0


class Produced(msgspec.Struct, tag=True, array_like=True):
    """The answer to AskProduced."""

    engine_id: str
    tenants: list[TenantProduced]
    orphans: list[ProducedRecord]
    unconfirmed: int


# Gateways may not send StopLoop: only the engine's operator stops it (a signal, or EngineServer.stop).
ToServer = Submit | Abort | SetWeight | Hello | Ping | Billed | AskProduced
FromServer = IterationReport | SubmitFailed | Announce | WorkerExiting | Produced


def tokenizer_from_files(files: dict[str, str]) -> Tokenizer:
    """The engine's tokenizer from the files it announced (only the names a tokenizer reads are written)."""
    with tempfile.TemporaryDirectory(prefix="fairserve-tokenizer-") as tmp:
        for name in TOKENIZER_FILES:
            if name in files:
                (Path(tmp) / name).write_text(files[name])
        return Tokenizer.from_dir(tmp)
