"""What fairserve sends an upstream engine and how it reads what comes back: kinds, stream options, SSE
chunks, queue gauges, and the `--upstream` settings."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from engine.core.errors import InvalidRequestError
from engine.core.sampling_params import SamplingParams
from gateway.settings import GatewaySettings
from upstream.call import RetryableFailure, parse_chunk, refuse_unsupported, request_body
from upstream.config import UpstreamSettings
from upstream.kinds import KINDS, detect_kind, gauge_value

VLLM_PAGE = """# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting_total{engine="0"} 99.0
vllm:num_requests_running{engine="0",model_name="m"} 8.0
"""


def test_each_engine_is_told_by_its_own_metric_names_and_else_by_owned_by() -> None:
    assert detect_kind(VLLM_PAGE, None) == "vllm"
    assert detect_kind("sglang:num_queue_reqs 0\n", None) == "sglang"
    assert detect_kind("tgi_queue_size 4\n", None) == "tgi"
    assert detect_kind(None, "sglang") == "sglang"
    assert detect_kind("process_cpu_seconds_total 1\n", "huggingface") == "openai"


def test_the_queue_gauge_sums_its_label_sets_and_ignores_longer_names() -> None:
    assert gauge_value(VLLM_PAGE, "vllm:num_requests_waiting") == 5.0
    assert gauge_value("tgi_queue_size 4\n", "tgi_queue_size") == 4.0
    assert gauge_value(VLLM_PAGE, "sglang:num_queue_reqs") is None


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_vllm_and_sglang_are_asked_for_usage_on_every_chunk(kind: str) -> None:
    body = request_body("m", "hi", SamplingParams(max_tokens=5, ignore_eos=True), KINDS[kind])
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["ignore_eos"] is True


@pytest.mark.parametrize("kind", ["tgi", "openai"])
def test_other_engines_stream_with_final_usage_and_only_standard_fields(kind: str) -> None:
    body = request_body("m", "hi", SamplingParams(max_tokens=5, ignore_eos=True, top_k=3), KINDS[kind])
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert "ignore_eos" not in body and "top_k" not in body


def test_chunks_carry_text_finish_reason_and_usage() -> None:
    chunk = parse_chunk(
        '{"choices":[{"index":0,"text":"ab","finish_reason":null}],"usage":{"prompt_tokens":3,"completion_tokens":2}}'
    )
    assert chunk is not None and chunk.text == "ab" and chunk.usage is not None
    assert (chunk.usage.prompt_tokens, chunk.usage.completion_tokens) == (3, 2)
    final = parse_chunk('{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":9}}')
    assert final is not None and final.text == "" and final.usage is not None
    assert parse_chunk("not json") is None
    with pytest.raises(RetryableFailure):
        parse_chunk('{"error":{"message":"engine died"}}')


@pytest.mark.parametrize(
    "field,params", [("n", SamplingParams(n=2)), ("logprobs", SamplingParams(logprobs=2))]
)
def test_what_an_upstream_does_not_serve_is_refused_naming_the_field(
    field: str, params: SamplingParams
) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        refuse_unsupported(params)
    assert refused.value.field_name == field


def test_several_urls_for_one_model_are_its_replicas() -> None:
    settings = UpstreamSettings(targets=["a=http://h1:8000/", "b=http://h2:8000", "a=http://h3:8000"])
    assert settings.replicas() == {"a": ["http://h1:8000", "http://h3:8000"], "b": ["http://h2:8000"]}


@pytest.mark.parametrize(
    "target", ["nomodel", "=http://h:1", "m=ftp://h:1", "m=http://", "m=http://h:1 ", "m=http://h:1"]
)
def test_a_bad_or_repeated_target_is_refused_naming_it(target: str) -> None:
    targets = [target, target] if target.startswith("m=http://h:1") else [target]
    with pytest.raises(ValidationError) as refused:
        UpstreamSettings(targets=targets)
    assert target.strip() in str(refused.value)


def test_upstream_settings_are_one_node_of_the_gateway_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAIRSERVE_UPSTREAM__KIND", "sglang")
    settings = GatewaySettings.load({"upstream": {"targets": ["m=http://127.0.0.1:9"]}})
    assert settings.upstream.kind == "sglang"
    assert settings.upstream.replicas() == {"m": ["http://127.0.0.1:9"]}
    with pytest.raises(ValidationError):
        GatewaySettings.load({"upstream": {"window_min": 9, "window_start": 4}})
