"""A simulated vLLM engine over real HTTP: what fairserve's upstream tests and bench.upstream stand behind.

It speaks vLLM's OpenAI-compatible API (`/v1/models`, `/v1/completions`, `/v1/chat/completions`, streamed
or not, `stream_options.include_usage` and `continuous_usage_stats`, the final usage chunk, `[DONE]`) and
exposes vLLM's Prometheus names on `/metrics`. Behind it is an engine that serves requests, not tenants:
a fixed batch of slots filled first come first served, one token per running request per step of a set
time (bench/vllm_sim/core.py). A client that disconnects aborts its request, as vLLM does.

It lives in `bench/` because both a test and a benchmark start it (`python -m bench.vllm_sim`, or
`bench.vllm_sim.process.start_sim`), it imports no other fairserve package (so it can never share code
with the gateway it stands in front of), and under `bench/` it needs no layer contract of its own.
"""

READY = "READY"  # the first line on stdout once it serves: "READY http://HOST:PORT"
