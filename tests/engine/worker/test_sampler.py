"""Sampler: greedy, top-k/top-p limits, seeded reproducibility, and the temperature-scaled distribution."""

from __future__ import annotations

import math

import pytest
import torch

from engine.core.request import Request, RequestMeta
from engine.core.sampling_params import SamplingParams
from engine.worker.sampler import Sampler

VOCAB = 50


def _request(rid: str, **params: float | int | None) -> Request:
    return Request(rid, [1], SamplingParams(**params), RequestMeta())  # type: ignore[arg-type]


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_rows_are_the_argmax() -> None:
    logits = _logits(8)
    requests = [_request(f"r{i}", temperature=0.0) for i in range(8)]
    assert Sampler(0).sample(logits, requests) == [int(torch.argmax(row)) for row in logits]


def test_greedy_rows_in_a_mixed_batch_stay_argmax() -> None:
    logits = _logits(6, seed=1)
    requests = [_request(f"r{i}", temperature=0.0 if i % 2 else 1.0, seed=i) for i in range(6)]
    tokens = Sampler(0).sample(logits, requests)
    assert [tokens[i] for i in (1, 3, 5)] == [int(torch.argmax(logits[i])) for i in (1, 3, 5)]


def test_top_k_one_and_tiny_top_p_equal_greedy() -> None:
    logits = _logits(16, seed=2)
    want = [int(torch.argmax(row)) for row in logits]
    for limit in ({"top_k": 1}, {"top_p": 1e-6}):
        requests = [_request(f"r{i}", temperature=1.5, seed=i, **limit) for i in range(16)]
        assert Sampler(0).sample(logits, requests) == want, limit


def _draws(sampler: Sampler, logits: torch.Tensor, requests: list[Request], target: str, n: int) -> list[int]:
    """Sample `n` times from the batch; return the tokens of the request named `target`."""
    row = next(i for i, r in enumerate(requests) if r.request_id == target)
    return [sampler.sample(logits, requests)[row] for _ in range(n)]


def test_seeded_sampling_ignores_batch_composition_and_row_order() -> None:
    row = _logits(1, seed=3)[0] / 3  # flat enough that draws vary
    target = _request("target", temperature=1.0, seed=42)
    alone = _draws(Sampler(seed=0), row.unsqueeze(0), [target], "target", 30)
    others = [
        _request("x", temperature=1.0),
        _request("y", temperature=0.7, seed=5),
        _request("z", temperature=0.0),
    ]
    batch = [others[0], others[1], target, others[2]]
    mixed = _draws(
        Sampler(seed=99),
        torch.stack([_logits(1, 7)[0], _logits(1, 8)[0], row, _logits(1, 9)[0]]),
        batch,
        "target",
        30,
    )
    reordered = _draws(
        Sampler(seed=1), torch.stack([row, _logits(1, 9)[0]]), [target, others[2]], "target", 30
    )
    assert alone == mixed == reordered
    assert len(set(alone)) > 3  # it really samples: a constant sequence would pass trivially


def test_different_seeds_give_different_sequences() -> None:
    row = (_logits(1, seed=3)[0] / 3).unsqueeze(0)
    a = _draws(Sampler(0), row, [_request("a", temperature=1.0, seed=1)], "a", 30)
    b = _draws(Sampler(0), row, [_request("a", temperature=1.0, seed=2)], "a", 30)
    assert a != b


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_temperature_scales_the_distribution() -> None:
    base = torch.tensor([0.1, 0.2, 0.3, 0.4])
    logits = base.log().unsqueeze(0).repeat(4000, 1)
    critical = 16.27  # chi-square, 3 degrees of freedom, p = 0.001
    for temperature in (1.0, 2.0, 0.5):
        request = _request("t", temperature=temperature, seed=11)
        tokens = Sampler(0).sample(logits, [request] * len(logits))
        counts = torch.bincount(torch.tensor(tokens), minlength=4).float()
        want = base ** (1 / temperature)
        want = want / want.sum()
        assert _chi_square(counts, want) < critical, (temperature, counts.tolist())
        # The untempered distribution must be rejected when the temperature changes it.
        if temperature != 1.0:
            assert _chi_square(counts, base) > critical, (temperature, counts.tolist())


def test_top_p_keeps_only_the_nucleus() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().unsqueeze(0).repeat(3000, 1)
    tokens = Sampler(0).sample(logits, [_request("p", temperature=1.0, top_p=0.7, seed=3)] * 3000)
    counts = torch.bincount(torch.tensor(tokens), minlength=4).float()
    assert counts[2:].sum() == 0  # 0.5 + 0.3 already reach 0.7
    share = counts[0] / counts.sum()
    assert math.isclose(float(share), 0.5 / 0.8, abs_tol=0.04)


# -- the batched sampler: its distribution, seeds across batches, logprobs, isolation -------------------


def _expected(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float, bias: dict[int, float]
) -> list[float]:
    """The distribution a row must be drawn from, computed from the definition in plain Python: bias, then
    temperature, then the k largest, then the smallest most-likely prefix whose mass reaches top_p."""
    scores = [float(x) + bias.get(i, 0.0) for i, x in enumerate(logits.tolist())]
    scaled = [s / temperature for s in scores]
    order = sorted(range(len(scaled)), key=lambda i: -scaled[i])
    kept = order[:top_k] if top_k else order
    top = max(scaled[i] for i in kept)
    weights = {i: math.exp(scaled[i] - top) for i in kept}
    total = sum(weights.values())
    nucleus, mass = [], 0.0
    for i in kept:
        if mass >= top_p:
            break
        nucleus.append(i)
        mass += weights[i] / total
    norm = sum(weights[i] for i in nucleus)
    return [weights[i] / norm if i in nucleus else 0.0 for i in range(len(scores))]


def _assert_frequencies(tokens: list[int], probs: list[float]) -> None:
    """Every token's frequency within 5 standard errors of its probability (the bound from the sample size:
    a correct sampler fails this with probability under 1e-5 per token); impossible tokens never drawn."""
    n = len(tokens)
    counts = torch.bincount(torch.tensor(tokens), minlength=len(probs)).tolist()
    for token, (count, p) in enumerate(zip(counts, probs, strict=True)):
        if p == 0.0:
            assert count == 0, (token, count)
            continue
        bound = 5 * math.sqrt(p * (1 - p) / n) + 1 / n
        assert abs(count / n - p) <= bound, (token, count / n, p, bound)


SETTINGS = {"temperature": 1.5, "top_k": 6, "top_p": 0.8}
BIAS = {3: 1.0, 7: -1.5, 11: 1.5}


@pytest.mark.parametrize(("top_k", "top_p"), [(6, 0.8), (0, 0.8), (6, 1.0)])
def test_the_drawn_distribution_is_bias_temperature_top_k_then_top_p(top_k: int, top_p: float) -> None:
    """Top-p among the top-k's candidates, over the whole vocabulary, and top-k alone."""
    row = torch.randn(16, generator=torch.Generator().manual_seed(5))
    want = _expected(row, 1.5, top_k, top_p, BIAS)
    assert sum(p > 0 for p in want) >= 3  # the test really samples among several tokens
    n = 20_000
    logits = row.unsqueeze(0).repeat(n, 1)
    for seed in (None, 17):  # the shared generator and a request's own
        params = SamplingParams(temperature=1.5, top_k=top_k, top_p=top_p, seed=seed, logit_bias=BIAS)
        tokens = Sampler(0).sample(logits, [Request("d", [1], params, RequestMeta())] * n)
        _assert_frequencies(tokens, want)
        # The bound is tight enough to tell a sampler that skipped a step: without top-p, or top-k.
        with pytest.raises(AssertionError):
            _assert_frequencies(
                tokens,
                _expected(row, 1.5, top_k, 1.0, BIAS) if top_p < 1 else _expected(row, 1.5, 0, 1.0, BIAS),
            )


def _mixed_request(rid: str, seed: int | None, **extra: object) -> Request:
    params = SamplingParams(seed=seed, logit_bias=BIAS, logprobs=3, **SETTINGS)  # type: ignore[arg-type]
    for name, value in extra.items():
        setattr(params, name, value)
    return Request(rid, [1], params, RequestMeta())


def test_a_seeded_row_is_the_same_whatever_shares_its_batch() -> None:
    """Seeded, biased, truncated and with logprobs: alone, beside greedy/unseeded/other-seed rows in any order,
    and beside a row whose sampling fails, the request draws the same tokens with the same logprobs."""
    row = torch.randn(16, generator=torch.Generator().manual_seed(6))
    target = _mixed_request("target", 42)

    def run(sampler: Sampler, batch: list[Request], rows: list[torch.Tensor]) -> list[tuple[int, float]]:
        where = batch.index(target)
        out = []
        for _ in range(40):
            token = sampler.sample(torch.stack(rows), batch)[where]
            out.append((token, sampler.last_logprobs["target"].logprob))
        return out

    alone = run(Sampler(0), [target], [row])
    others = [
        _mixed_request("greedy", None, temperature=0.0),
        _mixed_request("unseeded", None, logprobs=None),
        _mixed_request("other-seed", 7, top_k=0),
        _mixed_request("broken", 2**70),  # torch refuses the seed: this row fails alone
    ]
    noise = [torch.randn(16, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    target_again = Sampler(123)
    for perm in ([0, 1, 2, 3], [3, 2, 1, 0]):
        batch = [others[i] for i in perm]
        batch.insert(2, target)
        rows = [noise[i] for i in perm]
        rows.insert(2, row)
        sampler = Sampler(99)
        mixed = run(sampler, batch, rows)
        # The same tokens; logprobs to rounding (a batch where some row has no top-k takes the softmax
        # over the whole vocabulary, one where all have over their candidates: sums in another order).
        assert [t for t, _ in mixed] == [t for t, _ in alone]
        assert [lp for _, lp in mixed] == pytest.approx([lp for _, lp in alone], abs=1e-5)
        assert set(sampler.failures.take()) == {"broken"}
    assert run(target_again, [target], [row]) == alone  # the same form: exactly equal
    assert len({t for t, _ in alone}) > 2  # it really samples


def test_logprobs_are_of_the_distribution_sampled_from() -> None:
    logits = torch.randn(3, 16, generator=torch.Generator().manual_seed(8)) * 2
    requests = [
        _mixed_request("sampled", 1),
        _mixed_request("greedy", None, temperature=0.0, logprobs=5),
        _mixed_request("none", None, logprobs=0),
    ]
    sampler = Sampler(0)
    tokens = sampler.sample(logits, requests)
    for row, request in enumerate(requests):
        params = request.sampling
        temperature = 1.0 if params.greedy else params.temperature
        probs = _expected(logits[row], temperature, params.top_k, params.top_p, BIAS)
        got = sampler.last_logprobs[request.request_id]
        want = [math.log(p) if p else float("-inf") for p in probs]
        assert got.logprob == pytest.approx(want[tokens[row]], abs=1e-5)
        ranked = sorted(range(16), key=lambda i: -want[i])[: params.logprobs]
        assert got.top_logprobs == pytest.approx([want[i] for i in ranked], abs=1e-5)
        finite = [i for i in ranked if want[i] > float("-inf")]  # the excluded tie at -inf in any order
        assert got.top_ids[: len(finite)] == finite
    greedy = logits[1] + torch.tensor([BIAS.get(i, 0.0) for i in range(16)])
    assert tokens[1] == int(greedy.argmax())


def test_rows_without_logprobs_report_none() -> None:
    logits = _logits(2)
    sampler = Sampler(0)
    sampler.sample(logits, [_request("a", temperature=0.5, seed=1), _mixed_request("b", 2)])
    assert set(sampler.last_logprobs) == {"b"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_one_step_synchronises_once() -> None:
    """Every kind of row on the GPU: the host waits for the device once, at the copy of the results."""
    device = torch.device("cuda")
    logits = torch.randn(8, 1000, device=device)
    penalties = SamplingParams(
        temperature=0.7, presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.2
    )
    requests = [
        Request("penalized", [1, 2, 2, 7], penalties, RequestMeta()),
        Request("min_p", [1], SamplingParams(temperature=0.9, min_p=0.1), RequestMeta()),
        _request("greedy", temperature=0.0),
        _request("sampled", temperature=0.8, top_k=50, top_p=0.9),
        _mixed_request("seeded", 3),
        _mixed_request("unseeded", None),
        Request("bias", [1], SamplingParams(temperature=0.0, logit_bias={5: 3.0}), RequestMeta()),
        _request("plain", temperature=1.0),
    ]
    sampler = Sampler(0)
    sampler.sample(logits, requests)  # first use: generators and bias tensors are made (and copied) here
    torch.cuda.synchronize()
    with pytest.warns(UserWarning, match="synchroniz") as caught:
        torch.cuda.set_sync_debug_mode("warn")
        try:
            tokens = sampler.sample(logits, requests)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert len([w for w in caught if "synchroniz" in str(w.message)]) == 1
    assert len(tokens) == 8 and sampler.last_sampled is not None and sampler.last_sampled.is_cuda
