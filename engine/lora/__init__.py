"""LoRA adapters served over one base model (docs/engine.md, "LoRA adapters"), behind `--lora NAME=PATH`.

    adapter.py    a PEFT directory read with json + safetensors (no peft import), validated against the model
    registry.py   the engine's adapters: name -> slot; the ones that failed to load
    stack.py      every slot's A and B per (layer, module), ranks zero-padded: what the kernels read
    batch.py      one step's adapted rows as sorted segments per slot (built on the host, with the batch)
    apply.py      y += scale * (x @ A^T) @ B^T for every segment: SGMV shrink + expand (Triton or torch twin)
    cost.py       the rank-aware service factor an adapter's requests are charged (docs/fairness.md)

Without adapters nothing here runs: each adapted projection tests `AttentionMetadata.lora is None`, the
runner builds no segments and the scheduler charges as before.
"""
