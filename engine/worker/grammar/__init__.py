"""Grammar-constrained decoding: compile a request's grammar off the engine loop, mask its logits each step.

    config.py    GrammarConfig: compile timeout, per-tenant compile bound, the service rate of mask time
    backend.py   the llguidance binding: the tokenizer adapter, grammar text, compile, limits
    compiler.py  GrammarCompiler: compiles on worker threads, cached by grammar hash, bounded per tenant
    intake.py    GrammarIntake: requests wait here for their grammar, holding no batch seat
    masks.py     GrammarMasks: per-token masks computed beside the forward pass, applied before sampling

llguidance is imported only by backend.py, and only when the first grammar arrives.
"""
