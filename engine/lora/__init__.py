"""LoRA adapters served over one base model (docs/engine.md, "LoRA adapters"), behind `--lora NAME=PATH`.

    adapter.py    a PEFT directory read with json + safetensors (no peft import), validated against the model
    registry.py   the engine's adapters: name -> slot and weights on the device; the ones that failed to load
    batch.py      one step's rows grouped by adapter (built on the host, with the batch)
    apply.py      y += scale * (x @ A^T) @ B^T for each group's rows: the torch twin (a Triton SGMV is later)
    cost.py       the rank-aware service factor an adapter's requests are charged (docs/fairness.md)

Without adapters nothing here runs: each adapted projection tests `AttentionMetadata.lora is None`, the
runner builds no groups and the scheduler charges as before.
"""
