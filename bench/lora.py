"""LoRA adapters in the engine: throughput with 1, 8 and 64 distinct adapters against the base, and the charge.

    .venv/bin/python -m bench.lora --out artifacts/lora.json

Throughput: one engine over a small random model (bench.small_models) with `--adapters` random rank-16
PEFT adapters on every projection (written with peft into a temp dir), one batch of `--requests`
requests, greedy with EOS ignored. Request i of a run with k distinct adapters uses adapter i mod k;
the base run uses none. The runs alternate (base, 1, 8, 64, base, ...) for `--rounds` rounds after a
warm-up round, in this process on `--threads` torch threads (default 1); the ratio is the median over rounds of a run's
output tokens/s over the base's in the same round (the best round's tokens/s is shown beside it).

Charge: two tenants of equal weight, one under a rank-8 adapter and one under a rank-64 adapter, both
kept backlogged (more requests than `max_num_seqs`); after `--fair-steps` engine steps, each tenant's
charged service is read from the fairness policy's counters (`policy.service()`), not computed here.
Their ratio should be 1 ± 0.1: equal weights get equal charged service, so the rank-64 tenant gets
fewer tokens. Results: docs/engine.md ("LoRA adapters") and docs/kernels.md ("SGMV").
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bench.harness import table
from bench.small_models import write_small_model
from engine import LLM, SamplingParams
from engine.core.request import RequestMeta

MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def write_adapters(base: Path, root: Path, ranks: list[int], seed: int) -> list[Path]:
    """One peft adapter directory per rank, every projection targeted, A and B random (B not zero, so
    each adapter changes the output); one peft model per distinct rank, re-drawn before each save."""
    import peft
    import transformers

    transformers.utils.logging.disable_progress_bar()
    paths: list[Path] = []
    models: dict[int, Any] = {}
    for i, rank in enumerate(ranks):
        if rank not in models:
            model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
            config = peft.LoraConfig(
                r=rank, lora_alpha=2 * rank, target_modules=MODULES, init_lora_weights=False
            )
            models[rank] = peft.get_peft_model(model, config)
        torch.manual_seed(seed + i)
        with torch.no_grad():
            for param in models[rank].parameters():
                if param.requires_grad:
                    param.copy_(torch.randn_like(param) * 0.02)
        paths.append(root / f"adapter-{i}")
        models[rank].save_pretrained(str(paths[-1]))
    return paths


@dataclass
class Run:
    """One throughput configuration: how many distinct adapters its batch uses (0: the base model)."""

    adapters: int
    rates: list[float] = field(default_factory=list)  # output tokens per wall second, each measured round
    cpu_rates: list[float] = field(default_factory=list)  # output tokens per CPU second of this process

    @property
    def best_tokens_per_s(self) -> float:
        return max(self.rates)

    def ratio(self, base: Run, cpu: bool = False) -> float:
        """Median over rounds of this run's rate over the base run's of the same round: each pair ran
        back to back, so load from elsewhere on the machine cancels better than in a ratio of bests.
        `cpu`: per CPU second of this process, which other processes' load on a shared machine moves less."""
        mine, theirs = (self.cpu_rates, base.cpu_rates) if cpu else (self.rates, base.rates)
        return statistics.median(m / t for m, t in zip(mine, theirs, strict=True))


def serve(llm: LLM, prompts: list[list[int]], adapters: int, max_tokens: int) -> tuple[float, float]:
    """Output tokens per wall second and per CPU second of one batch, request i under adapter
    i mod `adapters` (none when 0)."""
    metas = [RequestMeta(lora=None if adapters == 0 else f"a{i % adapters}") for i in range(len(prompts))]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    start, cpu_start = time.perf_counter(), time.process_time()
    outputs = llm.generate(prompts, [params] * len(prompts), metas)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    produced = sum(len(o.token_ids) for o in outputs)
    if produced != max_tokens * len(prompts):
        raise RuntimeError(f"{adapters} adapters: {produced} tokens, expected {max_tokens * len(prompts)}")
    return produced / seconds, produced / cpu_seconds


def throughput(base: Path, adapter_paths: list[Path], args: argparse.Namespace) -> list[Run]:
    """The alternated runs of `args.distinct` distinct adapters and of the base; best round of each."""
    lora = {f"a{i}": str(p) for i, p in enumerate(adapter_paths)}
    llm = LLM(
        str(base), dtype="float32", lora=lora, max_num_seqs=args.requests, max_lora_rank=args.rank, seed=0
    )
    assert llm.engine.lora is not None and not llm.engine.lora.failed, llm.engine.lora
    prompts = [[(7 * i + j) % 250 for j in range(args.prompt_tokens)] for i in range(args.requests)]
    runs = [Run(0)] + [Run(k) for k in args.distinct]
    for round_ in range(args.rounds + 1):
        for run in runs:
            rate, cpu_rate = serve(llm, prompts, run.adapters, args.max_tokens)
            if round_ > 0:  # round 0 warms every path up
                run.rates.append(rate)
                run.cpu_rates.append(cpu_rate)
    return runs


def charge(base: Path, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Two equal-weight tenants, rank 8 and rank 64, both backlogged: their charged service and tokens."""
    small, large = write_adapters(base, root / "fair", [8, 64], seed=1000)
    llm = LLM(
        str(base),
        dtype="float32",
        lora={"r8": str(small), "r64": str(large)},
        max_num_seqs=args.fair_seqs,
        max_lora_rank=64,
        seed=0,
    )
    engine = llm.engine
    tenants = {"rank8": "r8", "rank64": "r64"}
    # A request takes 8 steps or more and the two tenants share fair_seqs seats, so neither can finish
    # more than fair_seqs * fair_steps / 8: each keeps over a step's worth queued to the end.
    per_tenant = args.fair_seqs * (args.fair_steps // 8 + 2)
    for i in range(per_tenant):
        # Output lengths 8..24, the same sequence for both: completions stagger, so seats free one by one.
        params = SamplingParams(max_tokens=8 + (5 * i) % 17, temperature=0.0, ignore_eos=True)
        for tenant, adapter in tenants.items():
            prompt = [(11 * i + j) % 250 for j in range(args.prompt_tokens)]
            engine.add_request(f"{tenant}-{i}", prompt, params, RequestMeta(tenant_id=tenant, lora=adapter))
    tokens, finished = dict.fromkeys(tenants, 0), dict.fromkeys(tenants, 0)
    ratios: list[float] = []
    for _ in range(args.fair_steps):
        for out in engine.step_deltas():
            tenant = out.request_id.split("-")[0]
            tokens[tenant] += len(out.new_token_ids)
            finished[tenant] += out.finish_reason is not None
        now = engine.policy.service()
        ratios.append(now.get("rank8", 0.0) / max(now.get("rank64", 0.0), 1e-9))
    unfinished = {t: per_tenant - finished[t] for t in tenants}  # over fair_seqs each: still backlogged
    service = engine.policy.service()
    assert engine.lora is not None
    loaded = {t: engine.lora.host.get(engine.lora.key(RequestMeta(lora=a))) for t, a in tenants.items()}
    scales = {t: adapter.service_scale for t, adapter in loaded.items() if adapter is not None}
    for request_id in [f"{t}-{i}" for t in tenants for i in range(per_tenant)]:
        engine.abort_request(request_id)
    return {
        "charged_service": {t: service[t] for t in tenants},
        "ratio_rank8_to_rank64": service["rank8"] / service["rank64"],
        "output_tokens": tokens,
        # The cumulative ratio over the run's second half: VTC bounds the gap, not each step's ratio.
        "ratio_second_half": [min(ratios[len(ratios) // 2 :]), max(ratios[len(ratios) // 2 :])],
        "unfinished": unfinished,
        "service_scale": scales,
        "steps": args.fair_steps,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--adapters", type=int, default=64, help="adapters loaded (the most distinct in a batch)"
    )
    parser.add_argument("--distinct", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--requests", type=int, default=64, help="the batch: one request per sequence slot")
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fair-seqs", type=int, default=8, help="max_num_seqs of the charge run")
    parser.add_argument("--fair-steps", type=int, default=240)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (one: CPU seconds are then this run's own work)"
    )
    parser.add_argument("--out", help="write the JSON report here")
    args = parser.parse_args(argv)
    if max(args.distinct) > args.adapters:
        parser.error(f"--distinct {max(args.distinct)} exceeds --adapters {args.adapters}")
    logging.basicConfig(level=logging.WARNING)
    # On a shared machine idle OpenMP threads spin on the CPU while another process holds a core, which
    # inflates CPU seconds too; with one thread both clocks measure this run's work.
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-lora-") as tmp:
        root = Path(tmp)
        base = root / "base"
        write_small_model(base)
        paths = write_adapters(base, root / "tput", [args.rank] * args.adapters, seed=0)
        runs = throughput(base, paths, args)
        fair = charge(base, root, args)
    base_run = runs[0]
    rows = [
        f"{'base' if r.adapters == 0 else f'{r.adapters} adapters'} | {r.best_tokens_per_s:.0f} | "
        f"{r.ratio(base_run):.2f} | {max(r.cpu_rates):.0f} | {r.ratio(base_run, cpu=True):.2f}"
        for r in runs
    ]
    header = "batch | best tok/s (wall) | × base (wall) | best tok/CPU-s | × base (CPU)"
    print("\n".join(table(header, "lrrrr", rows)))
    print("(× base: the median over rounds of the ratio to the base run of the same round)")
    service = fair["charged_service"]
    print(
        f"\ncharged service rank8 {service['rank8']:.0f} : rank64 {service['rank64']:.0f} = "
        f"{fair['ratio_rank8_to_rank64']:.3f} (second half {fair['ratio_second_half'][0]:.3f}.."
        f"{fair['ratio_second_half'][1]:.3f}); tokens {fair['output_tokens']}; factors {fair['service_scale']}; "
        f"unfinished at the end {fair['unfinished']}"
    )
    report = {
        "args": vars(args),
        "machine": {
            "platform": platform.platform(),
            "torch_threads": torch.get_num_threads(),
            "python": sys.version.split()[0],
        },
        "throughput": [
            {
                "adapters": r.adapters,
                "tokens_per_s": r.best_tokens_per_s,
                "rates": r.rates,
                "cpu_rates": r.cpu_rates,
                "x_base_cpu": r.ratio(base_run, cpu=True),
                "x_base": r.ratio(base_run),
            }
            for r in runs
        ],
        "charge": fair,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
