"""What each actor reserves, sized to the cluster it lands on, and a refusal at once when it cannot fit.

Ray places an actor only where its reservation fits, and an actor that fits nowhere waits, silently, for
ever. So `ray up` and `ray scale` work the numbers out before they create anything: a reservation left to
`auto` is a fraction of the free CPUs (the deployment takes at most half of them, so `ray scale` can double
it, and no actor reserves more than one CPU), and a request that does not fit fails naming the CPUs asked,
the CPUs free and the flags that change either. Ray's reservations are bookkeeping, not limits: a fraction
of a CPU still runs the engine on every core torch gives it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cluster.config import ClusterConfig

MIN_SHARE = 0.01  # the smallest reservation `auto` hands out; below it the cluster is full
HEADROOM = 2.0  # `auto` sizes a deployment to 1/HEADROOM of the free CPUs: room for `ray scale` to double it
FLAGS = (
    "lower --engines or --gateways, reserve less per actor with --engine-cpus / --gateway-cpus, "
    "or give a local cluster more with --num-cpus"
)


class DoesNotFit(ValueError):
    """The actors asked for cannot all be placed on the cluster; the message names the numbers."""


@dataclass(frozen=True)
class Capacity:
    """What the cluster has: CPUs and GPUs free now and in all."""

    cpus_free: float
    cpus_total: float
    gpus_free: float = 0.0


@dataclass(frozen=True)
class Reservations:
    """CPUs each engine and each gateway actor reserves."""

    engine_cpus: float
    gateway_cpus: float


def _floor(x: float) -> float:
    return math.floor(x * 100) / 100


def size(cfg: ClusterConfig, engines: int, gateways: int, capacity: Capacity) -> Reservations:
    """Reservations for `engines` and `gateways` more actors; DoesNotFit when they cannot all be placed.

    Given `--engine-cpus`/`--gateway-cpus` are taken as they are; the others (`auto`) share half of what
    the given ones leave free, at most one CPU each.
    """
    given = engines * (cfg.engine_cpus or 0.0) + gateways * (cfg.gateway_cpus or 0.0)
    auto = (engines if cfg.engine_cpus is None else 0) + (gateways if cfg.gateway_cpus is None else 0)
    share = min(1.0, _floor((capacity.cpus_free - given) / (HEADROOM * auto))) if auto else 0.0
    share = max(share, MIN_SHARE)
    engine_cpus = share if cfg.engine_cpus is None else cfg.engine_cpus
    gateway_cpus = share if cfg.gateway_cpus is None else cfg.gateway_cpus
    asked = engines * engine_cpus + gateways * gateway_cpus
    if asked > capacity.cpus_free + 1e-9:
        raise DoesNotFit(
            f"{engines} engine(s) and {gateways} gateway(s) do not fit: they ask {asked:.2f} CPUs "
            f"({engines} x {engine_cpus:g} for engines, {gateways} x {gateway_cpus:g} for gateways), "
            f"the cluster has {capacity.cpus_free:g} CPUs free ({capacity.cpus_total:g} in all); {FLAGS}"
        )
    return Reservations(engine_cpus, gateway_cpus)


def check_gpus(engines: int, capacity: Capacity, per_engine: int = 1) -> None:
    """Engines on CUDA take one GPU per tensor-parallel rank each: DoesNotFit when the cluster has fewer free."""
    asked = engines * per_engine
    if asked > capacity.gpus_free:
        each = f" of {per_engine} GPUs (--tensor-parallel-size)" if per_engine > 1 else ""
        raise DoesNotFit(
            f"{engines} CUDA engine(s){each} ask {asked} GPUs, the cluster has {capacity.gpus_free:g} free; "
            "lower --engines or add GPU nodes"
        )
