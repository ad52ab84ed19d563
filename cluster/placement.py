"""Each engine's placement group: the resources of all its tensor-parallel ranks, reserved as one unit.

An engine's ranks are one engine actor (rank 0) and its child processes (ranks 1..N-1, engine/worker/parallel/):
Ray sees one actor. The group holds one bundle with every rank's GPU (and the engine's CPUs) under
STRICT_PACK, so all ranks land on one node, where the all-reduce runs over NVLink (NCCL) or shared memory
(gloo). The actor is scheduled into that bundle, and the group is detached and outlives the actor: when a
rank dies the engine actor exits (cluster/engine_actor.py), Ray restarts it, and with it every rank, into
the same reservation. The GPUs are never released between the death and the restart, so nothing else
can take one of them and leave the restarted engine waiting for a GPU. Scale-down and `ray down`
remove the group with its actor.

One bundle, not one per rank (vLLM's layout): a bundle's GPUs go to the actor scheduled in it, and ranks
1..N-1 are the actor's children, not actors of their own, so they can only use the actor's bundle.
"""

from __future__ import annotations

import contextlib

import ray
from ray.util.placement_group import (
    PlacementGroup,
    get_placement_group,
    placement_group,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

GROUP_SUFFIX = "-ranks"


def group_name(engine_name: str) -> str:
    """The placement group of the engine actor `engine_name`."""
    return engine_name + GROUP_SUFFIX


def reserve_ranks(engine_name: str, resources: dict[str, float]) -> PlacementGroupSchedulingStrategy:
    """A detached group of one bundle holding `resources` (Ray's `num_cpus`/`num_gpus` options of the engine
    actor), and the strategy that schedules the actor into it. A group left by an earlier actor of the same
    name (a `ray up` that died before removing it) is removed first: its bundle may not fit `resources`."""
    release_ranks(engine_name)
    bundle = {"CPU": resources.get("num_cpus", 0.0)}
    if resources.get("num_gpus"):
        bundle["GPU"] = resources["num_gpus"]
    group = placement_group(
        [bundle], strategy="STRICT_PACK", name=group_name(engine_name), lifetime="detached"
    )
    return PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=0)


def release_ranks(engine_name: str) -> None:
    """Remove the engine's group (after its actor is killed); nothing if it has none."""
    with contextlib.suppress(ValueError):  # no group by that name
        remove_placement_group(get_placement_group(group_name(engine_name)))


def ranks_group(engine_name: str) -> PlacementGroup | None:
    """The engine's group, if it has one (`ray status` and the tests)."""
    try:
        group: PlacementGroup = get_placement_group(group_name(engine_name))
    except ValueError:
        return None
    return group


def group_state(group: PlacementGroup) -> str:
    """Ray's state of the group (CREATED once its bundle is reserved)."""
    table = ray.util.placement_group_table(group)
    return str(table.get("state", "UNKNOWN"))
