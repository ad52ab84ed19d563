"""Where each settings flag shows in `--help`: the ten a new user needs first, then one section per concern.

The settings tree is laid out by owner (the engine's knobs in `engine.*`, the gateway's at the top), which
is not how a reader looks for a flag: `--tokens-per-minute`'s neighbours are the queue bounds, wherever
they live. This table only orders the help; flags, variables and TOML keys stay those of the tree.
"""

from __future__ import annotations

Path = tuple[str, ...]

START = "start here"
# The flags a first `serve` needs, in the order a reader meets them (README "Quick start").
FIRST: tuple[Path, ...] = (
    ("models", "local_models"),
    ("engine", "model"),  # `fairserve engine --model`; in `serve` the same as --model given once
    ("host",),
    ("port",),
    ("engine", "device"),
    ("engine", "dtype"),
    ("engine", "fairness", "policy"),
    ("engine", "lora"),
    ("data_dir",),
    ("db_url",),
    ("redis_url",),
    ("listen",),
)
# Sections in help order, each with the path prefixes it takes; the first matching prefix wins, and a
# knob that matches none is a server knob.
SECTIONS: tuple[tuple[str, tuple[Path, ...]], ...] = (
    (
        "fairness",
        (
            ("engine", "fairness"),
            ("engine", "redis_url"),
            ("engine", "counter_sync_interval_s"),
            ("engine", "counter_sync_prefix"),
        ),
    ),
    (
        "admission and quotas",
        (
            ("engine", "caps"),
            ("engine", "grammar", "max_compiles_per_tenant"),
            ("models", "on_infeasible"),
            ("max_queued_requests",),
            ("max_queued_tokens",),
            ("default_tenant_queued_requests",),
            ("retry_jitter",),
            ("prior_prefill_tokens_per_s",),
            ("prior_iteration_s",),
            ("quota_on_redis_failure",),
            ("refusal_burst",),
            ("refusal_rate_per_s",),
            ("report_burst",),
            ("report_rate_per_s",),
            ("report_hold_after",),
            ("report_hold_s",),
            ("auth_failure_burst",),
            ("auth_failure_rate_per_s",),
            ("tokenize_concurrency_per_tenant",),
            ("tokenize_workers",),
            ("preprocess_cpu_share",),
            ("preprocess_burst_s",),
            ("preprocess_max_wait_s",),
            ("max_chat_messages",),
            ("max_body_bytes",),
            ("max_json_depth",),
            ("responses_store_entries",),
            ("responses_store_chars",),
            ("max_unkeyed_connections_per_address",),
        ),
    ),
    ("ledger", (("ledger",),)),
    (
        "observability",
        (
            ("log_level",),
            ("log_format",),
            ("print_secrets",),
            ("access_log",),
            ("metrics_tenants",),
            ("metrics_host",),
            ("metrics_port",),
            ("loop_debug",),
            ("loop_budget_ms",),
            ("engine", "otlp_endpoint"),
            ("engine", "trace_sample_ratio"),
            ("engine", "trace_path"),
        ),
    ),
    (
        "cluster",
        (
            ("engines",),
            ("upstream",),
            ("engine_heartbeat_timeout_s",),
            ("engine_lost_timeout_s",),
            ("cluster_key_file",),
            ("routing",),
            ("workers",),
            ("insecure_no_cluster_key",),
            ("gateway_timeout_s",),
            ("role",),
            ("kv_hold_timeout_s",),
            ("kv_pull_timeout_s",),
            # `fairserve ray up`'s tree (gateway/cluster_settings.py)
            ("address",),
            ("namespace",),
            ("gateways",),
            ("engine_cpus",),
            ("gateway_cpus",),
            ("max_restarts",),
            ("engine_host",),
            ("num_cpus",),
            ("poll_interval_s",),
            ("ping_timeout_s",),
            ("drain_timeout_s",),
            ("ready_timeout_s",),
        ),
    ),
    ("model and engine", (("engine",), ("models",), ("engine_process",), ("restart_engine",))),
)
SERVER = "server"
ORDER = (
    START,
    SERVER,
    "model and engine",
    "fairness",
    "admission and quotas",
    "ledger",
    "observability",
    "cluster",
)
TITLES = {
    START: "start here (every flag is also FAIRSERVE_<PATH> in the environment and a key of the --config file)",
    SERVER: "server: where it listens, what it stores, connections",
    "model and engine": "model and engine: the model, device, batch and KV cache",
    "fairness": "fairness: how the engine shares the accelerator between tenants",
    "admission and quotas": "admission and quotas: what a tenant may queue and send",
    "ledger": "ledger: the usage records' writer",
    "observability": "observability: metrics, traces, event-loop debugging",
    "cluster": "cluster: attached and upstream engines, routing, several gateways",
}
# Metavars that say what to write, where the field name would not (`--model DIR`, not LOCAL_MODELS).
METAVARS = {
    "local_models": "DIR",
    "model": "DIR",
    "data_dir": "DIR",
    "cache_dir": "DIR",
    "host": "HOST",
    "port": "PORT",
    "db_url": "URL",
    "redis_url": "URL",
    "otlp_endpoint": "URL",
    "lora": "NAME=PATH",
    "fallback_models": "BIG=SMALL",
    "model_costs": "NAME=FACTOR",
    "engines": "tcp://HOST:PORT",
    "listen": "tcp://HOST:PORT",
    "cluster_key_file": "FILE",
}


def section_of(path: Path) -> str:
    """The help section of the knob at `path`."""
    if path in FIRST:
        return START
    for name, prefixes in SECTIONS:
        if any(path[: len(prefix)] == prefix for prefix in prefixes):
            return name
    return SERVER


def metavar(leaf: str, kind: type) -> str:
    """What a flag's value is, in the help: DIR, URL, SECONDS, N, rather than the field's name in capitals."""
    if leaf in METAVARS:
        return METAVARS[leaf]
    if leaf.endswith("_s"):
        return "SECONDS"
    if leaf.endswith("_ms"):
        return "MS"
    if leaf.endswith("bytes"):
        return "BYTES"
    return {int: "N", float: "NUMBER"}.get(kind, leaf.upper())


def help_order(path: Path) -> int:
    """Sort key of the knobs: the start flags in FIRST's order, the rest as the tree declares them."""
    return FIRST.index(path) if path in FIRST else len(FIRST)
