"""Skip feedback on its own (cache_core/feedback.py): the sampler's response found by running it on
scalars, which samplers it serves, and the correction it makes after skipped calls."""

from __future__ import annotations

import importlib

import pytest
import torch


@pytest.fixture
def feedback(core):
    return importlib.import_module(f"{core.__name__}.feedback")


SIGMAS = tuple(3.0 * t / (1.0 + 2.0 * t) for t in (1.0 - i / 12 for i in range(13)))  # FLUX-like, ends at 0


def euler(model, x, sigmas, **_):
    """k-diffusion's Euler, written out: x += (sigma_next - sigma) * (x - denoised) / sigma."""
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i] * torch.ones(x.shape[0], dtype=x.dtype))
        x = x + (sigmas[i + 1] - sigmas[i]) * (x - denoised) / sigmas[i]
    return x


def two_step(model, x, sigmas, **_):
    """A multistep sampler: each update also uses the previous call's output."""
    previous = None
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i] * torch.ones(x.shape[0], dtype=x.dtype))
        estimate = denoised if previous is None else 1.5 * denoised - 0.5 * previous
        x = x + (sigmas[i + 1] - sigmas[i]) * (x - estimate) / sigmas[i]
        previous = denoised
    return x


def noisy_euler(model, x, sigmas, **_):
    return euler(model, x, sigmas) + 0.01 * torch.randn_like(x)


def two_calls_per_step(model, x, sigmas, **_):
    for i in range(len(sigmas) - 1):
        half = model(x, sigmas[i] * torch.ones(x.shape[0], dtype=x.dtype))
        denoised = model(0.5 * (x + half), sigmas[i] * torch.ones(x.shape[0], dtype=x.dtype))
        x = x + (sigmas[i + 1] - sigmas[i]) * (x - denoised) / sigmas[i]
    return x


def measure(feedback, sampler):
    sigmas = torch.tensor(SIGMAS, dtype=torch.float64)
    return feedback.SamplerResponse.measure(lambda model, x: sampler(model, x, sigmas), len(SIGMAS) - 1)


def test_euler_response_is_its_own_recurrence(feedback):
    response = measure(feedback, euler)
    assert isinstance(response, feedback.SamplerResponse) and response.single_step
    steps = len(SIGMAS) - 1
    for k in range(steps):
        # The sample after call k moves by -(sigma_next - sigma) / sigma per unit of denoised output ...
        assert response.weights[k + 1][k] == pytest.approx(-(SIGMAS[k + 1] - SIGMAS[k]) / SIGMAS[k], rel=1e-12)
        # ... then decays by the sigma ratio at every later step, and no call moves an earlier sample.
        for i in range(k + 2, steps + 1):
            assert response.weights[i][k] == pytest.approx(
                response.weights[i - 1][k] * SIGMAS[i - 1 + 1] / SIGMAS[i - 1], rel=1e-9, abs=1e-15)
        assert all(response.weights[i][k] == 0.0 for i in range(k + 1))
    assert response.weights[steps][steps - 1] == pytest.approx(1.0)  # the last step returns its output


def test_rounding_in_a_float32_schedule_is_not_taken_for_history(feedback):
    """A schedule ComfyUI computed in float32, 30 steps to 0: the last step's rows are rounding noise."""
    t = torch.linspace(1.0, 0.0, 31)
    sigmas = (3.0 * t / (1.0 + 2.0 * t)).double()
    response = feedback.SamplerResponse.measure(lambda model, x: euler(model, x, sigmas), 30)
    assert isinstance(response, feedback.SamplerResponse)


@pytest.mark.parametrize(("sampler", "reason"), [
    (two_step, "multistep"), (noisy_euler, "adds noise"), (two_calls_per_step, "24 model calls for 12 steps"),
])
def test_samplers_it_does_not_serve_say_why(feedback, sampler, reason):
    response = measure(feedback, sampler)
    assert isinstance(response, str) and reason in response


def run_euler(feedback_run, truth, estimates, skipped):
    """Euler with a denoiser that ignores x (the truth at each step), skipped steps returning the
    given estimates instead; ``feedback_run`` (or None) sees every output. Returns every sample."""
    samples = [torch.full((2, 3), 0.7, dtype=torch.float64)]
    for i in range(len(SIGMAS) - 1):
        denoised = estimates[i] if i in skipped else truth[i]
        if feedback_run is not None:
            denoised = feedback_run.output(("cond",), i, i in skipped, denoised)
        samples.append(samples[-1] + (SIGMAS[i + 1] - SIGMAS[i]) * (samples[-1] - denoised) / SIGMAS[i])
    return samples


def test_feedback_cancels_skips_exactly_where_the_output_is_linear_in_sigma(feedback):
    steps = len(SIGMAS) - 1
    start, end = torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64)
    truth = [start + (end - start) * (1.0 - SIGMAS[i] / SIGMAS[0]) for i in range(steps)]
    estimates = {i: truth[i] + 0.3 * torch.randn(2, 3, dtype=torch.float64) for i in range(steps)}
    skipped = {3, 4, 7, 8}
    uncached = run_euler(None, truth, estimates, set())
    fed_back = feedback.SkipFeedback(measure(feedback, euler), SIGMAS)
    corrected = run_euler(fed_back, truth, estimates, skipped)
    not_corrected = run_euler(None, truth, estimates, skipped)
    assert fed_back.corrected == 2  # at steps 5 and 9
    # The sample after each correcting call is the uncached one again; without feedback it is not.
    for sample in (6, 10, 11):
        assert torch.allclose(corrected[sample], uncached[sample], rtol=0, atol=1e-10), sample
        assert not torch.allclose(not_corrected[sample], uncached[sample], atol=1e-3), sample


def test_feedback_changes_nothing_when_nothing_is_skipped(feedback):
    steps = len(SIGMAS) - 1
    truth = [torch.randn(2, 3, dtype=torch.float64) for _ in range(steps)]
    fed_back = feedback.SkipFeedback(measure(feedback, euler), SIGMAS)
    for i in range(steps):
        assert fed_back.output(("cond",), i, False, truth[i]) is truth[i]
    assert fed_back.corrected == 0


def test_a_conditioning_that_misses_a_step_starts_over(feedback):
    """A context window that moved, or a restart: no interpolation across the gap."""
    fed_back = feedback.SkipFeedback(measure(feedback, euler), SIGMAS)
    ones = torch.ones(1, 2, dtype=torch.float64)
    fed_back.output("a", 0, False, ones)
    fed_back.output("a", 1, True, 2 * ones)
    fed_back.output("b", 2, False, ones)  # "a" is not called at step 2
    assert fed_back.output("a", 3, False, ones) is not None and fed_back.corrected == 0
    fed_back.output("a", 4, True, 2 * ones)
    fed_back.forget()
    out = fed_back.output("a", 5, False, ones)
    assert out is ones and fed_back.corrected == 0
