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
