"""The lab probe of docs/experiments.md section 27 (``./dev py -m stepbench.feedback``) finds the
sampler's sensitivities by running ComfyUI's own sampler on scalars: the check that this is right is
Euler, whose sample moves by exactly dsigma per unit of velocity at each step."""

from __future__ import annotations

import pytest


@pytest.fixture
def flux_sigmas(host):
    """12 steps of a flow schedule shifted as FLUX's is (short steps early, long late), ending at 0."""
    import torch

    t = torch.linspace(1.0, 0.0, 13, dtype=torch.float64)
    return 3.0 * t / (1.0 + 2.0 * t)


def test_euler_sensitivity_is_the_step_in_sigma(host, flux_sigmas):
    import comfy.samplers
    from stepbench.feedback import sampler_sensitivities

    euler = comfy.samplers.ksampler("euler")
    sensitivities = sampler_sensitivities(euler.sampler_function, flux_sigmas, euler.extra_options, "d")
    steps = len(flux_sigmas) - 1
    assert len(sensitivities) == steps + 1
    final = sensitivities[-1]
    for k in range(steps):
        assert final[k] == pytest.approx(float(flux_sigmas[k + 1] - flux_sigmas[k]), rel=1e-9, abs=1e-12)
    # The sample at call i depends on the outputs of earlier calls only.
    for i in range(steps):
        assert all(value == 0.0 for value in sensitivities[i][i:]), i


def test_dpmpp_2m_uses_each_output_in_two_updates(host, flux_sigmas):
    import comfy.samplers
    from stepbench.feedback import sampler_sensitivities

    dpmpp = comfy.samplers.ksampler("dpmpp_2m")
    sensitivities = sampler_sensitivities(dpmpp.sampler_function, flux_sigmas, dpmpp.extra_options, "D")
    middle = len(flux_sigmas) // 2
    after_own_step = sensitivities[middle + 1][middle]
    after_next_step = sensitivities[middle + 2][middle]
    assert after_own_step > 0.0
    # The next update subtracts a share of it again (its history term), beyond the decay of the sample.
    own_then_decayed = after_own_step * float(flux_sigmas[middle + 2] / flux_sigmas[middle + 1])
    assert after_next_step < own_then_decayed


def test_the_chained_form_gives_back_the_uncached_samples_on_dpmpp_2m(host, flux_sigmas):
    """Experiments section 34: with outputs linear in sigma (so the interpolation is exact) and the
    model's output independent of the sample, the chained correction leaves every sample after the
    first computed call past a skip as the uncached run's, through dpmpp_2m's history term."""
    import comfy.samplers
    import torch
    from stepbench.feedback import Feedback, sampler_sensitivities

    dpmpp = comfy.samplers.ksampler("dpmpp_2m")
    generator = torch.Generator().manual_seed(0)
    start, end = (torch.randn(1, 4, dtype=torch.float64, generator=generator) for _ in range(2))
    skipped = {3, 4, 7}
    errors = {step: 0.3 * torch.randn(1, 4, dtype=torch.float64, generator=generator) for step in skipped}

    def run(feedback: Feedback | None, skips: set[int]) -> list[torch.Tensor]:
        samples: list[torch.Tensor] = []

        def model(x: torch.Tensor, sigma: torch.Tensor, **_: object) -> torch.Tensor:
            step = len(samples)
            samples.append(x.clone())
            truth = start + (end - start) * (1.0 - float(sigma[0]) / float(flux_sigmas[0]))
            output = truth + errors[step] if step in skips else truth
            if feedback is None:
                return output
            return feedback.chained(step, float(sigma[0]), step in skips, output, output)

        result = dpmpp.sampler_function(model, torch.zeros(1, 4, dtype=torch.float64), flux_sigmas,
                                        extra_args={}, callback=None, disable=True, **dpmpp.extra_options)
        return [*samples, result]

    chained = Feedback({}, dpmpp, "D", "next", "linear", None, chain=True)
    chained.sensitivities = sampler_sensitivities(dpmpp.sampler_function, flux_sigmas, dpmpp.extra_options, "D")
    uncached, corrected, not_corrected = run(None, set()), run(chained, skipped), run(None, skipped)
    for sample in (6, 7, 9, 10, 11):  # after the computed calls 5 and 8, and on
        assert torch.allclose(corrected[sample], uncached[sample], rtol=0, atol=1e-10), sample
        assert not torch.allclose(not_corrected[sample], uncached[sample], atol=1e-4), sample
    # (The result is the last call's output itself, on any path: x = denoised at sigma 0.)
    assert torch.allclose(corrected[12], uncached[12], rtol=0, atol=1e-10)
