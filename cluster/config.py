"""ClusterConfig, the `ray` node of the settings tree, lives in gateway/cluster_settings.py (so that
`fairserve config show` can list it without importing Ray); re-exported for cluster/."""

from gateway.cluster_settings import ENV_PREFIX, ClusterConfig

__all__ = ["ENV_PREFIX", "ClusterConfig"]
