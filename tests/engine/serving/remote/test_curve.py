"""`--cluster-key`: an engine's port admits only gateways holding the same key file, over CurveZMQ.

An engine server runs on a thread here (the whole engine, real sockets on loopback TCP). A gateway with the
key streams greedy tokens; one without a key, one with another deployment's key, and a bare ZeroMQ peer are
refused in the handshake, so nothing they send can reach the engine loop. The key file is created 0600,
and a bad one is refused naming the field."""

from __future__ import annotations

import asyncio
import logging
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
from pydantic import ValidationError
from zmq.utils.monitor import recv_monitor_message

from engine import LLM, EngineConfig, RequestMeta, RequestOutput, SamplingParams
from engine.serving.boundary.messages import Submit
from engine.serving.boundary.process_engine import EngineStartError
from engine.serving.remote.client import RemoteEngine
from engine.serving.remote.curve import ClusterKey, ClusterKeyError, create_key_file
from engine.serving.remote.messages import Announce, FromServer, Hello
from engine.serving.remote.server import EngineServer
from gateway.settings import GatewaySettings
from tests.defaults import GATEWAY_TIMEOUT_S, GRACE_PERIOD_S, SILENCE

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def key_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys")
    assert create_key_file(path / "ours") and create_key_file(path / "theirs")
    return path


@pytest.fixture(scope="module")
def keyed_engine(key_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineServer]:
    config = EngineConfig(num_kv_blocks=64, cache_dir=str(tmp_path_factory.mktemp("models")))
    server = EngineServer(
        config,
        "tcp://127.0.0.1:0",
        GATEWAY_TIMEOUT_S,
        GRACE_PERIOD_S,
        cluster_key=ClusterKey.load(key_dir / "ours"),
    )
    server.start()
    serving = threading.Thread(target=server.run, daemon=True)
    serving.start()
    yield server
    server.stop()
    serving.join(30)


def generate(engine: RemoteEngine, prompt: str, request_id: str) -> list[RequestOutput]:
    async def run() -> list[RequestOutput]:
        ids = engine.tokenizer.encode(prompt)
        return [o async for o in engine.generate(ids, GREEDY, RequestMeta(tenant_id="t"), request_id)]

    return asyncio.run(run())


def test_a_gateway_with_the_key_is_served_the_same_tokens(keyed_engine: EngineServer, key_dir: Path) -> None:
    want = LLM(None, num_kv_blocks=64).generate(["over curve"], GREEDY)[0]
    engine = RemoteEngine(keyed_engine.address, SILENCE, cluster_key=ClusterKey.load(key_dir / "ours"))
    try:
        engine.start()
        outs = generate(engine, "over curve", "keyed-1")
    finally:
        engine.shutdown()
    assert list(outs[-1].token_ids) == want.token_ids
    assert "".join(o.delta_text for o in outs) == want.text


@pytest.mark.parametrize("which", ["no key", "another key"])
def test_a_gateway_without_the_key_is_refused_in_the_handshake(
    keyed_engine: EngineServer, key_dir: Path, which: str
) -> None:
    key = None if which == "no key" else ClusterKey.load(key_dir / "theirs")
    engine = RemoteEngine(keyed_engine.address, SILENCE, cluster_key=key)
    engine.start_timeout_s = 120.0  # the refusal must come from the handshake, long before this
    try:
        with pytest.raises(EngineStartError, match="same --cluster-key"):
            engine.start()
    finally:
        engine.shutdown()


def handshake_outcome(sock: zmq.Socket[Any], address: str, frame: bytes) -> zmq.Event:
    """Connect `sock` to `address`, queue `frame`, and return the first handshake outcome (success or any
    failure)."""
    mon = sock.get_monitor_socket(
        zmq.EVENT_HANDSHAKE_SUCCEEDED
        | zmq.EVENT_HANDSHAKE_FAILED_AUTH
        | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
        | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    )
    try:
        sock.connect(address)
        sock.send(frame, zmq.NOBLOCK)  # queued on the connection, sent only if the handshake succeeds
        assert mon.poll(30_000), "no handshake outcome within 30 s"
        return zmq.Event(recv_monitor_message(mon)["event"])
    finally:
        sock.disable_monitor()
        mon.close(linger=0)


@pytest.mark.parametrize("peer", ["bare", "engine key only", "gateway key"])
def test_a_peer_without_the_gateway_key_never_reaches_the_engine(
    keyed_engine: EngineServer, key_dir: Path, peer: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A peer that skips RemoteEngine, its Submit for another tenant queued: a bare socket fails CURVE, one
    that somehow learnt the engine's public key is refused by the ZAP allow-list (and logged), and the
    same socket with the gateway key gets through, so the check tells them apart."""
    caplog.set_level(logging.WARNING, logger="fairserve.engine.remote")
    key = ClusterKey.load(key_dir / "ours")
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if peer != "bare":
        public, secret = (
            zmq.curve_keypair() if peer == "engine key only" else (key.gateway_public, key.gateway_secret)
        )
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = key.engine_public, public, secret
    try:
        submit = msgspec.msgpack.encode(
            Submit("intruder", [1, 2, 3], GREEDY, RequestMeta(tenant_id="victim"))
        )
        event = handshake_outcome(sock, keyed_engine.address, submit)
    finally:
        sock.close(linger=0)
        ctx.term()
    assert (event == zmq.EVENT_HANDSHAKE_SUCCEEDED) == (peer == "gateway key"), event
    if peer == "engine key only":
        assert any(
            "refused a peer" in r.getMessage() and public.decode() in r.getMessage() for r in caplog.records
        )


def test_the_key_file_is_created_private_once_and_never_shown(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "cluster_key"
    assert create_key_file(path)
    text = path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not create_key_file(path) and path.read_text() == text  # an existing key is never replaced
    key = ClusterKey.load(path)
    assert key.engine_secret != key.gateway_secret and key.engine_public != key.gateway_public
    assert zmq.curve_public(key.gateway_secret) == key.gateway_public
    assert text.strip() not in repr(key) and key.engine_secret.decode() not in repr(key)
    assert create_key_file(tmp_path / "other") and ClusterKey.load(tmp_path / "other") != key


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("short", "40 Z85 characters"),
        ("~" * 40, "Z85"),
        (None, "cannot read"),
    ],
)
def test_a_bad_key_file_is_refused_naming_the_setting(
    tmp_path: Path, content: str | None, reason: str
) -> None:
    path = tmp_path / "key"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ClusterKeyError, match=reason):
        ClusterKey.load(path)
    with pytest.raises(ValidationError, match="cluster_key_file") as err:
        GatewaySettings(cluster_key_file=path, engines=["tcp://127.0.0.1:5555"])
    assert reason in str(err.value)


def test_the_engine_command_refuses_a_bad_key_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.write_text("not a key")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "engine",
            "--listen",
            "tcp://127.0.0.1:0",
            "--data-dir",
            str(tmp_path / "data"),
            "--cluster-key",
            str(bad),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and "cluster_key_file" in run.stderr and "40 Z85" in run.stderr


def test_the_handshake_names_no_tenant(keyed_engine: EngineServer, key_dir: Path) -> None:
    """A peer's Hello is answered with the engine's figures, but nothing about tenants, even once the
    engine has served one (the iteration reports of a joined gateway carry those)."""
    key = ClusterKey.load(key_dir / "ours")
    engine = RemoteEngine(keyed_engine.address, SILENCE, cluster_key=key)
    try:
        engine.start()
        generate(engine, "a tenant's work", "named-1")
    finally:
        engine.shutdown()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = (
        key.engine_public,
        key.gateway_public,
        key.gateway_secret,
    )
    try:
        sock.connect(keyed_engine.address)
        sock.send(msgspec.msgpack.encode(Hello("peer-1")))
        decoder = msgspec.msgpack.Decoder(FromServer)
        assert sock.poll(30_000), "no answer to the Hello within 30 s"
        announce = decoder.decode(sock.recv())
    finally:
        sock.close(linger=0)
        ctx.term()
    assert isinstance(announce, Announce) and announce.model_name
    stats = announce.stats
    assert stats.service == {} and stats.waiting_by_tenant == {} and stats.running_by_tenant == {}
    link = keyed_engine._link  # the engine's own latest stats do name tenant t, which it served
    assert link is not None and "t" in link.latest_stats.service
