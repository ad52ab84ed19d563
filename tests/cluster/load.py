"""Client threads against a gateway, each request uniquely identified and its ending classified."""

from __future__ import annotations

import json
import random
import threading
import uuid
from collections import Counter

import httpx


class Load:
    """Sends completions (some streamed, some long) until stopped; `endings[request_id]` says how each ended:
    "answered" (the whole reply came), "retryable" (503 engine_unavailable with Retry-After, or that error
    event on a stream), "refused" (any other 4xx/5xx before the reply began) or "cut" (anything else)."""

    def __init__(self, url: str, key: str, model: str, clients: int = 4, long_share: float = 0.3) -> None:
        self.url, self.key, self.model, self.long_share = url, key, model, long_share
        self.endings: dict[str, str] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)]
        for t in self.threads:
            t.start()

    def count(self, ending: str) -> int:
        """Requests that ended so."""
        with self.lock:
            return sum(1 for e in self.endings.values() if e == ending)

    def ids(self, ending: str) -> set[str]:
        """Request ids that ended so."""
        with self.lock:
            return {rid for rid, e in self.endings.items() if e == ending}

    def tally(self) -> Counter[str]:
        """How many ended each way."""
        with self.lock:
            return Counter(self.endings.values())

    def _one(self, client: httpx.Client, rng: random.Random) -> tuple[str, str]:
        rid = f"ray-{uuid.uuid4().hex}"
        stream = rng.random() < 0.4
        max_tokens = 64 if rng.random() < self.long_share else rng.randint(1, 12)
        body = {
            "model": self.model,
            "prompt": "count " * rng.randint(1, 20),
            "max_tokens": max_tokens,
            "stream": stream,
        }
        headers = {"Authorization": f"Bearer {self.key}", "X-Request-Id": rid}
        if not stream:
            resp = client.post("/v1/completions", json=body, headers=headers)
            if resp.status_code == 200 and json.loads(resp.content)["choices"]:
                return rid, "answered"
            if (
                resp.status_code == 503
                and "engine_unavailable" in resp.text
                and "retry-after" in resp.headers
            ):
                return rid, "retryable"
            return rid, "refused"
        with client.stream("POST", "/v1/completions", json=body, headers=headers) as resp:
            lines = [line for line in resp.iter_lines() if line]
        if resp.status_code != 200:
            retryable = resp.status_code == 503 and "retry-after" in resp.headers
            return rid, "retryable" if retryable else "refused"
        if lines[-1:] == ["data: [DONE]"] and not any("engine_unavailable" in line for line in lines):
            return rid, "answered"
        return rid, "retryable" if any("engine_unavailable" in line for line in lines) else "cut"

    def _client(self, seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=self.url, timeout=60) as client:
            while not self.stop.is_set():
                try:
                    rid, ending = self._one(client, rng)
                except (httpx.HTTPError, json.JSONDecodeError, KeyError) as exc:
                    rid, ending = f"lost-{uuid.uuid4().hex}", f"cut ({type(exc).__name__})"
                with self.lock:
                    self.endings[rid] = ending

    def finish(self) -> Counter[str]:
        """Stop sending, wait for the requests in flight to end; the tally."""
        self.stop.set()
        for t in self.threads:
            t.join(120)
        assert not any(t.is_alive() for t in self.threads), "a client is stuck on a request"
        return self.tally()
