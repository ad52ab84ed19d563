"""LoRA adapters served over one base model (docs/engine.md, "LoRA adapters"): the `--lora NAME=PATH`
entries, and any (name, directory) a request names through `RequestMeta.lora_path`, loaded on demand.

    adapter.py     a PEFT directory read with json + safetensors (no peft import), validated against the model
    host_cache.py  adapters in host memory: an LRU of `max_cpu_loras`, loaded on worker threads, failures kept
    cache.py       adapters on the device: `max_loras` slots, LRU, the adapters of running requests pinned
    resident.py    the slots' stacked weights, kept as cache.py's hooks say, r_max grown to the largest rank
    stack.py       every slot's A and B per (layer, module), ranks zero-padded: what the kernels read
    intake.py      where a request waits for its adapter's load, outside the scheduler; the load's charge
    batch.py       one step's adapted rows as sorted segments per slot (built on the host, with the batch)
    apply.py       y += scale * (x @ A^T) @ B^T for every segment: SGMV shrink + expand (Triton or torch twin)
    cost.py        the rank-aware service factor an adapter's requests are charged (docs/fairness.md)

Without adapters nothing here runs: each adapted projection tests `AttentionMetadata.lora is None`, the
runner builds no segments while no slot holds an adapter, and the scheduler charges as before.
"""
