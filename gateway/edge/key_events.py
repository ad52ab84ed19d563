"""Key-cache invalidation across replicas over Redis pub/sub: a revoked key or a changed tenant is refused
by every gateway within a second, where the cache TTL alone (default 5 s) would let it through for longer.

A replica that changes a tenant or key (admin API, or the CLI given --redis) publishes the tenant id on
CHANNEL; every gateway's subscriber thread drops that tenant's cached keys. Pub/sub delivers only to
connected subscribers, so after any (re)subscription the subscriber clears its whole cache: whatever it
missed while disconnected cannot be served from memory. If Redis is unreachable the TTL stays the bound.
"""

from __future__ import annotations

import logging
import threading
import time

import redis
from redis.exceptions import RedisError

from billing import KeyCache

log = logging.getLogger(__name__)
CHANNEL = "fairserve:keys:changed"
ALL = "*"  # message meaning: forget every cached key


def publish_change(url: str, tenant_id: str = ALL, timeout_s: float = 0.5) -> bool:
    """Announce a change of `tenant_id`'s keys or settings to every subscribed gateway; False if Redis failed."""
    client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        client.publish(CHANNEL, tenant_id)
        return True
    except RedisError as exc:
        log.warning(
            "could not announce the key change of %s (replicas fall back to the cache TTL): %s",
            tenant_id,
            exc,
        )
        return False
    finally:
        client.close()


class KeyEvents:
    """One gateway's subscriber: a daemon thread applying invalidations to its KeyCache."""

    def __init__(self, url: str, keys: KeyCache, timeout_s: float = 0.5) -> None:
        self.url = url
        self.keys = keys
        self.timeout_s = timeout_s
        # health_check_interval makes redis-py ping an idle subscription, so a dead Redis is noticed.
        self._redis = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, health_check_interval=5
        )
        self._stop = threading.Event()
        self.subscribed = threading.Event()
        self.applied = 0  # messages applied, for tests and debugging
        self._thread = threading.Thread(target=self._run, name="fairserve-key-events", daemon=True)

    def start(self) -> None:
        """Start the subscriber thread."""
        self._thread.start()

    def close(self) -> None:
        """Stop the subscriber thread and its connection."""
        self._stop.set()
        self._thread.join(timeout=2 * self.timeout_s + 1.0)
        self._redis.close()

    def publish(self, tenant_id: str) -> bool:
        """Announce a change made through this gateway (blocking: call it off the event loop)."""
        return publish_change(self.url, tenant_id, self.timeout_s)

    def _apply(self, data: bytes | str) -> None:
        tenant_id = data.decode() if isinstance(data, bytes) else data
        if tenant_id == ALL:
            self.keys.invalidate()
        else:
            self.keys.invalidate_tenant(tenant_id)
        self.applied += 1

    def _run(self) -> None:
        # A hand-written back-off rather than a retry library: this is one long-lived session that is
        # re-established after a failure, not a call to retry, and it must stop promptly on close().
        backoff = 0.1
        last_warning = 0.0
        while not self._stop.is_set():
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(CHANNEL)
                self.keys.invalidate()  # changes made while unsubscribed were not heard
                self.subscribed.set()
                backoff = 0.1
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=self.timeout_s)
                    if message is not None and message.get("type") == "message":
                        self._apply(message["data"])
            except (RedisError, OSError) as exc:
                self.subscribed.clear()
                now = time.monotonic()
                if now - last_warning > 30.0:
                    last_warning = now
                    log.warning(
                        "key-change subscription to Redis lost (cache TTL applies meanwhile): %s", exc
                    )
                self._stop.wait(backoff)
                backoff = min(5.0, backoff * 2)
            finally:
                pubsub.close()
