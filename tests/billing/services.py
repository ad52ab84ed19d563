"""Reaching the real PostgreSQL and Redis of the test machine: fail under CI=true, skip otherwise."""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.redis_server import RedisServer, redis_server_binary

PG_HOST, PG_PORT = "127.0.0.1", 5432
REDIS_URL = "redis://127.0.0.1:6379/0"


def reachable(host: str, port: int) -> bool:
    """True when a TCP connection to host:port succeeds within a second."""
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def require(host: str, port: int, what: str) -> None:
    """Fail (CI=true) or skip (locally) when a backend service is not listening."""
    if reachable(host, port):
        return
    message = f"{what} at {host}:{port} is unreachable"
    if os.environ.get("CI") == "true":
        pytest.fail(message + " (CI=true: backend tests must run)")
    pytest.skip(message)


def private_redis(path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own on a free port, for tests that kill or freeze it (never the shared one)."""
    if redis_server_binary() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("redis-server is not installed (CI=true: Redis tests must run)")
        pytest.skip("redis-server is not installed")
    server = RedisServer(path)
    yield server
    server.stop()


@contextlib.contextmanager
def fresh_pg_database(prefix: str = "fairserve_test") -> Iterator[str]:
    """A uniquely named database on the machine's PostgreSQL, dropped on exit; yields its SQLAlchemy URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = f"host={PG_HOST} port={PG_PORT} user=postgres dbname=test"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://postgres@{PG_HOST}:{PG_PORT}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
