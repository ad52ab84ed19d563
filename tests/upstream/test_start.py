"""`fairserve serve --upstream` at start, as real processes: an upstream that is not there is one line naming
it and exit 3 (as for `--engine`); a silent one too, after the probe's bound; one that answers is probed and
the start-up log says what was found; upstream models and fairserve's own engine behind one gateway."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx

from bench.vllm_sim.process import running_sim
from tests.gateway.marked import run_marked, wait_no_leftovers
from tests.gateway.serve_process import ServeProcess


def _port_nobody_listens_on() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_upstream_that_refuses_is_one_line_naming_it_and_exit_3(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_port_nobody_listens_on()}"
    done, mark = run_marked("serve", "--port", "0", "--data-dir", str(tmp_path), "--upstream", f"m={url}")
    assert done.returncode == 3, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"fairserve serve: upstream m={url} is not answering"), (
        lines
    )
    assert "url:" not in done.stdout
    assert wait_no_leftovers(mark) == []


def test_an_upstream_that_accepts_and_never_answers_is_refused_after_the_probes_bound(tmp_path: Path) -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        began = time.monotonic()
        done, _ = run_marked(
            "serve",
            "--port",
            "0",
            "--data-dir",
            str(tmp_path),
            "--upstream",
            f"m={url}",
            "--upstream-start-timeout-s",
            "1",
        )
        print(f"silent upstream refused after {time.monotonic() - began:.1f}s (process start included)")
    assert done.returncode == 3, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == [f"fairserve serve: upstream m={url} is not answering: timed out"], lines


def test_the_start_log_says_what_the_probe_found_and_both_kinds_of_model_serve(tmp_path: Path) -> None:
    with running_sim(model="sim") as sim:
        serve = ServeProcess(
            tmp_path,
            "--upstream",
            f"sim={sim.url}",
            "--no-engine-process",
            "--model",
            str(_embedded_model(tmp_path)),
        )
        try:
            log = "".join(serve.output)
            assert f"upstream sim={sim.url}: vllm (probed), model 'sim', /metrics found, context 4096" in log
            headers = {"Authorization": f"Bearer {serve.banner['api_key']}"}
            with httpx.Client(base_url=serve.url, headers=headers, timeout=60) as client:
                models = sorted(m["id"] for m in client.get("/v1/models").json()["data"])
                assert "sim" in models and len(models) == 2
                for model in models:
                    done = client.post(
                        "/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 3}
                    )
                    assert done.status_code == 200, done.text
                    assert done.json()["usage"]["completion_tokens"] == 3
        finally:
            serve.stop()


def _embedded_model(tmp_path: Path) -> Path:
    from gateway.cli import main  # `fairserve model init DIR`: the embedded model, written offline

    directory = tmp_path / "own"
    assert main(["model", "init", str(directory)]) == 0
    return directory
