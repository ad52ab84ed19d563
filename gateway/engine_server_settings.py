"""EngineServerSettings: the settings tree of `fairserve engine`, a process that serves one engine to gateways.

Its `engine` subtree and the process knobs are GatewaySettings' own (gateway/settings.py `ProcessSettings`),
so a knob means the same in `serve` and `engine`; the fields here are the engine server's alone.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from engine.serving.remote.address import check_address, is_loopback
from gateway.settings import ProcessSettings


class EngineServerSettings(ProcessSettings):
    """`fairserve engine`: one engine served over TCP to the gateways that attach to it (`serve --engine`).

    The `engine` subtree is the very EngineConfig `serve` has, so a knob means the same in both commands
    and in the same FAIRSERVE_ENGINE__* variable and `[engine]` table.
    """

    listen: str = Field(
        default="tcp://127.0.0.1:5555",
        description="tcp://HOST:PORT to serve gateways on "
        "(port 0 picks a free one); without --cluster-key anyone who reaches it can submit work",
    )
    # Without a key the port takes work, as any tenant at any weight, from whoever reaches it: refused on a
    # non-loopback address unless the operator says so (gateway/cli/engine.py).
    insecure_no_cluster_key: bool = Field(
        default=False,
        description="listen on a non-loopback address without --cluster-key (anyone who reaches the port "
        "can submit work as any tenant)",
    )
    # The engine aborts the requests of a gateway it has not heard from for this long: a dead gateway must
    # not keep the engine computing for nobody. Gateways ping every 0.1 s.
    gateway_timeout_s: float = Field(
        default=3.0,
        gt=0,
        le=600,
        description="seconds of silence after which a gateway's requests are aborted",
        json_schema_extra={"flags": ["--gateway-timeout"]},
    )

    # Prefill and decode on separate engines (engine/serving/disagg.py, docs/scale.md "Prefill and decode apart").
    role: Literal["both", "prefill", "decode"] = Field(
        default="both",
        description="both: whole requests; prefill: prompts, then the KV goes to a decode engine; decode: "
        "continues requests whose KV it pulls from a prefill engine",
    )
    kv_hold_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="a prefill engine frees the KV held for a decode engine that has not pulled it by then",
        json_schema_extra={"flags": ["--kv-hold-timeout"]},
    )
    kv_pull_timeout_s: float = Field(
        default=5.0,
        gt=0,
        le=600,
        description="a decode engine fails a request whose KV the prefill engine has not sent by then",
        json_schema_extra={"flags": ["--kv-pull-timeout"]},
    )

    @field_validator("listen")
    @classmethod
    def _listen_address(cls, value: str) -> str:
        check_address(value, bind=True)
        return value

    @model_validator(mode="after")
    def _closed_by_default(self) -> EngineServerSettings:
        if (
            self.cluster_key_file is None
            and not self.insecure_no_cluster_key
            and not is_loopback(self.listen)
        ):
            raise ValueError(
                f"listen: {self.listen} is not a loopback address and no --cluster-key is given: anyone who "
                "reaches the port could submit work as any tenant. Give --cluster-key FILE (the same file to "
                "every gateway), or --insecure-no-cluster-key if a network boundary keeps others out"
            )
        return self
