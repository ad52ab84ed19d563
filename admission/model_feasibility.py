"""A feasibility estimate per model, learned from each model's observed prefill and decode rates.

Several models behind one gateway run at very different speeds, so one set of priors cannot say
whether a deadline is feasible on each. `ModelRates` keeps, per model, an exponentially weighted mean of
the prefill rate and the iteration time its engines report (the engine measures both over its recent
iterations; zero while it has measured nothing), and stands in the configured priors until a model has
reported any. The estimate itself is `feasibility.estimate` over that model's own live queue and rates,
with the learned rates where the engines report none: an engine idle now still has a rate.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

from admission.feasibility import Estimate, LoadStats, RatePriors, estimate

LEARNING_RATE = 0.2  # weight of each new observation: about the last five snapshots count


@dataclass
class LearnedRate:
    """One model's rates, how many observations the learned ones rest on, and where these come from:
    `measured` (its engines' own, now), `learned` (the mean of what they reported) or `prior`."""

    prefill_tokens_per_s: float
    iteration_s: float
    samples: int = 0
    source: str = "prior"


class ModelRates:
    """Per-model rates learned from stats snapshots, the priors until a model has measured any."""

    def __init__(self, priors: RatePriors) -> None:
        self.priors = priors
        self._rates: dict[str, LearnedRate] = {}
        # Per model, the fastest prefill rate and iteration time its engines ever reported: how fast a
        # request runs with the engine to itself, which decides whether waiting can help (`estimate`).
        self._fastest: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def observe(self, model: str, stats: LoadStats) -> LearnedRate:
        """Fold one stats snapshot of `model`'s engines in (rates of zero are 'not measured' and skipped)."""
        with self._lock:
            rate = self._rates.setdefault(
                model, LearnedRate(self.priors.prefill_tokens_per_s, self.priors.iteration_seconds)
            )
            prefill, iteration = stats.prefill_tokens_per_s, stats.iteration_seconds
            if prefill > 0 and iteration > 0:
                best = self._fastest.get(model, (prefill, iteration))
                self._fastest[model] = (max(best[0], prefill), min(best[1], iteration))
                keep = 0.0 if rate.samples == 0 else 1.0 - LEARNING_RATE
                rate.prefill_tokens_per_s = keep * rate.prefill_tokens_per_s + (1 - keep) * prefill
                rate.iteration_s = keep * rate.iteration_s + (1 - keep) * iteration
                rate.samples += 1
                rate.source = "learned"
            return LearnedRate(rate.prefill_tokens_per_s, rate.iteration_s, rate.samples, rate.source)

    def rate(self, model: str) -> LearnedRate:
        """What is known of `model` now (the priors for a model never observed)."""
        with self._lock:
            found = self._rates.get(model)
            if found is None:
                return LearnedRate(self.priors.prefill_tokens_per_s, self.priors.iteration_seconds)
            return LearnedRate(found.prefill_tokens_per_s, found.iteration_s, found.samples, found.source)

    def effective(self, model: str, stats: LoadStats) -> LearnedRate:
        """The rates an estimate of `model` uses now: its engines' measured ones, else the learned ones."""
        learned = self.observe(model, stats)
        if stats.prefill_tokens_per_s > 0 and stats.iteration_seconds > 0:
            return LearnedRate(
                stats.prefill_tokens_per_s, stats.iteration_seconds, learned.samples, "measured"
            )
        return learned

    def estimate(
        self, model: str, stats: LoadStats, tenant_id: str, prompt_tokens: int, max_tokens: int, fair: bool
    ) -> Estimate:
        """Start and worst-case finish of a request on `model`, from its live queue and rates; its `run_s`
        (the run alone, which says whether waiting can help) at the fastest rates the model has shown, since
        a busy engine's slower iterations are part of what waiting cures."""
        rate = self.effective(model, stats)
        est = estimate(
            _Measured(stats, rate),
            tenant_id,
            prompt_tokens,
            max_tokens,
            fair,
            RatePriors(rate.prefill_tokens_per_s, rate.iteration_s),
        )
        with self._lock:
            fastest = self._fastest.get(model)
        if fastest is None:
            return est
        alone = prompt_tokens / fastest[0] + max_tokens * fastest[1]
        return replace(est, run_s=min(est.run_s, alone))


class _Measured:
    """A model's live queue with the rates `ModelRates.effective` chose."""

    def __init__(self, stats: LoadStats, rate: LearnedRate) -> None:
        self.prefill_tokens_per_s = rate.prefill_tokens_per_s
        self.decode_tokens_per_s = stats.decode_tokens_per_s
        self.iteration_seconds = rate.iteration_s
        self.waiting = stats.waiting
        self.running = stats.running
        self.waiting_by_tenant = stats.waiting_by_tenant
        self.waiting_tokens = stats.waiting_tokens
        self.max_num_seqs = stats.max_num_seqs


# A truncated prompt is cut to fill this share of the time its deadline leaves for prefill, not all of it:
# the estimate is a mean, and a prompt cut to fit it exactly would miss its deadline about half the time.
TRUNCATE_HEADROOM = 0.8


def prefill_budget(est: Estimate, rate: LearnedRate, max_tokens: int, seconds_left: float) -> int:
    """How many prompt tokens can be prefilled so that the request still finishes in `seconds_left`, its
    start and `max_tokens` decode iterations counted (the estimate's own arithmetic), with
    TRUNCATE_HEADROOM; may be <= 0."""
    spare = seconds_left - est.start_s - max_tokens * rate.iteration_s
    return int(spare * TRUNCATE_HEADROOM * rate.prefill_tokens_per_s)
