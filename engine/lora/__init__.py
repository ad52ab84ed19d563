"""LoRA adapters served over one base model (docs/engine.md, "LoRA adapters"): the `--lora NAME=PATH`
entries, and any (name, directory) a request names through `RequestMeta.lora_path`, loaded on demand.

    adapter.py     a PEFT directory read with json + safetensors (no peft import), validated against the model
    host_cache.py  adapters in host memory: an LRU of `max_cpu_loras`, loaded on worker threads, failures kept
    cache.py       adapters on the device: `max_loras` slots, LRU, the adapters of running requests pinned
    intake.py      where a request waits for its adapter's load, outside the scheduler; the load's charge
    batch.py       one step's rows grouped by adapter (built on the host, with the batch)
    apply.py       y += scale * (x @ A^T) @ B^T for each group's rows: the torch twin (a Triton SGMV is later)
    cost.py        the rank-aware service factor an adapter's requests are charged (docs/fairness.md)

Without adapters nothing here runs: each adapted projection tests `AttentionMetadata.lora is None`, the
runner builds no groups while no slot holds an adapter, and the scheduler charges as before.
"""
