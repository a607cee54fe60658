"""In-graph calibration: MagCacheCalibrate / TeaCacheCalibrate, persistence, and bad input."""

from __future__ import annotations

import json
import logging

import pytest
import torch


def calibrate(host, node_name: str, model, job, save: bool = False, **extra):
    from harness.sampling import calibrate as run_calibration

    return run_calibration(node_name, model, job, save, **extra)


@pytest.fixture(scope="module")
def flux(host):
    return host.test_module("tiny_models").build_model("flux", seed=11)


def test_calibrating_is_sampling_plus_measuring(host, flux):
    from harness.sampling import Job

    job = Job("flux", steps=16)
    samples, calibration, report = calibrate(host, "MagCacheCalibrate", flux, job)
    # The calibrate node is a KSampler: the same image as KSampler with the same inputs.
    assert torch.equal(samples, job.run(flux))
    assert calibration.method == "magcache" and calibration.branches == (0, 1)
    ratios = calibration.mag_ratios()
    assert ratios.calibrated_steps == 16 and ratios.branch_count == 2
    assert "cond ratios: 1.00000" in report and "uncond ratios" in report
    # Deterministic for a fixed seed.
    _, again, _ = calibrate(host, "MagCacheCalibrate", flux, job)
    assert again.records == calibration.records


def test_measured_ratios_drive_applymagcache_at_any_step_count(host, flux):
    from harness.sampling import Job, apply, stats

    _, calibration, _ = calibrate(host, "MagCacheCalibrate", flux, Job("flux", steps=16))
    for steps in (12, 16, 30):
        patched, node_id = apply(flux, "magcache", threshold=0.3, max_consecutive_skips=3, ratios=calibration)
        Job("flux", steps=steps).run(patched)
        run = stats(node_id)
        assert run["disabled_reason"] is None and run["steps"] == steps
        assert run["constants"] == f"this model's calibration of {calibration.created}"
        assert all(len(b["pattern"]) == steps for b in run["branches"])


def test_teacache_fit_reproduces_its_measurements(host, flux):
    import numpy as np

    from harness.sampling import Job, apply, stats

    _, calibration, report = calibrate(host, "TeaCacheCalibrate", flux, Job("flux", steps=20))
    assert calibration.method == "teacache" and len(calibration.coefficients) == 5
    x, y = np.array(calibration.fit_points).T
    fitted = np.poly1d(calibration.coefficients)(x)
    # A least-squares fit does no worse than the best constant.
    assert np.mean((fitted - y) ** 2) <= np.mean((y - y.mean()) ** 2) + 1e-12
    assert "TeaCache coefficients" in report
    patched, node_id = apply(flux, "teacache", threshold=2.0, coefficients=calibration)
    Job("flux", steps=20).run(patched)
    assert stats(node_id)["calls_skipped"] > 0


def test_teacache_calibrations_add_up_over_runs(host, flux):
    from harness.sampling import Job

    _, first, _ = calibrate(host, "TeaCacheCalibrate", flux, Job("flux", steps=12))
    _, both, _ = calibrate(host, "TeaCacheCalibrate", flux, Job("flux", steps=20, seed=5), add_to=first)
    assert both.runs == 2 and len(both.fit_points) == len(first.fit_points) + 19 * 2
    assert both.coefficients != first.coefficients


def test_a_saved_calibration_is_found_again_for_the_same_model(host, flux, caplog):
    from harness.sampling import Job, apply, stats

    store = host.pack_module("nodes.calibration_store")
    _, calibration, report = calibrate(host, "MagCacheCalibrate", flux, Job("flux", steps=14), save=True)
    path = store.calibration_path("magcache", calibration.model)
    assert path.is_file() and str(path) in report
    # A clone (same weights) finds it without any ratios input.
    with caplog.at_level(logging.INFO, logger="stepcache"):
        patched, node_id = apply(flux.clone(), "magcache", threshold=0.3)
    assert any("saved calibration" in r.getMessage() for r in caplog.records)
    Job("flux", steps=14).run(patched)
    assert stats(node_id)["disabled_reason"] is None
    assert stats(node_id)["constants"] == f"this model's saved calibration of {calibration.created}"
    # Published constants chosen by name are used as chosen, not the saved calibration.
    chosen, node_id = apply(flux.clone(), "magcache", threshold=0.3, variant="flux.1-dev")
    Job("flux", steps=14).run(chosen)
    assert stats(node_id)["constants"] == ("published FLUX.1-dev ratios (Zehong-Ma/MagCache), "
                                           "chosen with the variant input")
    # Other weights do not.
    other = host.test_module("tiny_models").build_model("flux", seed=12)
    assert store.find("magcache", store.model_identity(other, calibration_family(host, other), "auto")) is None


def calibration_family(host, model):
    return host.pack_module("families").family_for(model.model)


def test_a_corrupt_saved_calibration_is_ignored_with_a_warning(host, caplog):
    from harness.sampling import Job, apply

    model = host.test_module("tiny_models").build_model("flux", seed=13)
    store = host.pack_module("nodes.calibration_store")
    _, calibration, _ = calibrate(host, "MagCacheCalibrate", model, Job("flux", steps=12), save=True)
    path = store.calibration_path("magcache", calibration.model)
    data = json.loads(path.read_text())
    data["measures"][3]["magnitude_ratio"] = float("nan")
    path.write_text(json.dumps(data))
    # Ignored: the tiny model, no published checkpoint, then has no ratios at all.
    with caplog.at_level(logging.WARNING, logger="stepcache"), \
            pytest.raises(ValueError, match="no MagCache ratios are published for this model"):
        apply(model, "magcache", threshold=0.06)
    assert any("ignoring the saved calibration" in r.getMessage() for r in caplog.records)


def test_a_calibration_of_another_model_is_refused_with_the_reason(host, flux):
    from harness.sampling import Job, apply

    tiny = host.test_module("tiny_models")
    _, other_weights, _ = calibrate(host, "MagCacheCalibrate", tiny.build_model("flux", seed=99), Job("flux", steps=12))
    with pytest.raises(ValueError, match="other weights"):
        apply(flux, "magcache", ratios=other_weights)
    _, wan, _ = calibrate(host, "MagCacheCalibrate", tiny.build_model("wan21", seed=0), Job("wan21", steps=12))
    with pytest.raises(ValueError, match="measured on a wan model"):
        apply(flux, "magcache", ratios=wan)
    _, tea, _ = calibrate(host, "TeaCacheCalibrate", flux, Job("flux", steps=12))
    with pytest.raises(ValueError, match="teacache calibration"):
        apply(flux, "magcache", ratios=tea)


@pytest.mark.parametrize("mutate", [
    lambda d: d.pop("measures"),
    lambda d: d.update(measures=[]),
    lambda d: d["measures"][0].update(magnitude_ratio=-1.0),
    lambda d: d["measures"][0].update(magnitude_ratio=float("inf")),
    lambda d: d["schedule"].update(progress=[0.0]),
    lambda d: d.update(version=99),
    lambda d: d.update(format="something else"),
    lambda d: d["measures"].pop(5),
])
def test_malformed_calibrations_are_refused_with_a_message(host, flux, mutate):
    from harness.sampling import Job

    core = host.pack_module("cache_core.calibration")
    _, calibration, _ = calibrate(host, "MagCacheCalibrate", flux, Job("flux", steps=12))
    data = json.loads(json.dumps(calibration.to_json()))
    assert core.Calibration.from_json(data) == calibration  # round trip
    mutate(data)
    with pytest.raises(core.CalibrationError) as error:
        core.Calibration.from_json(data)
    assert str(error.value)


@pytest.mark.parametrize(("text", "steps", "interleaved", "message"), [
    ("", 0, False, "empty"),
    ("1.0, 1.1, banana", 0, False, "not a list of numbers"),
    ("1.0, 1.1, nan, 1.0", 0, False, "finite and positive"),
    ("1.0, -1.1, 1.0", 0, False, "finite and positive"),
    ("1.0, 1.1, 1.0", 0, True, "even length"),
    ("1.0, 1.1, 1.0, 0.9", 3, False, "needs 3 entries"),
])
def test_bad_ratio_text_is_a_validation_message(host, text, steps, interleaved, message):
    node = host.pack_module("nodes.calibrate_nodes").MagCacheRatiosFromText
    result = node.validate_inputs(text=text, calibrated_steps=steps, interleaved=interleaved)
    assert isinstance(result, str) and message in result


def test_published_ratio_text_is_accepted_and_used(host, flux):
    from harness.sampling import Job, apply, stats

    node = host.pack_module("nodes.calibrate_nodes").MagCacheRatiosFromText
    text = "[1.0]+[1.21094, 1.11719, 1.07812, 1.0625, 1.03906, 1.03125, 1.03906, 1.02344, 1.03125, 1.02344]"
    assert node.validate_inputs(text=text.replace("[1.0]+", "1.0,"), calibrated_steps=0, interleaved=False) is True
    (ratios,) = node.execute(text=text.replace("[1.0]+", "1.0,"), calibrated_steps=0, interleaved=False).result
    patched, node_id = apply(flux, "magcache", threshold=0.2, ratios=ratios)
    Job("flux").run(patched)
    assert stats(node_id)["calls_skipped"] > 0


@pytest.mark.parametrize(("text", "message"), [("", "empty"), ("1.0", "at least 2"), ("1, inf", "finite"),
                                               ("1, x", "not a list of numbers")])
def test_bad_coefficient_text_is_a_validation_message(host, text, message):
    node = host.pack_module("nodes.calibrate_nodes").TeaCacheCoefficientsFromText
    result = node.validate_inputs(text=text)
    assert isinstance(result, str) and message in result


def test_calibrating_an_unsupported_model_says_so(host):
    from harness.sampling import Job

    unet = host.test_module("tiny_models").build_sd15_unet()
    with pytest.raises(ValueError, match="nothing to calibrate"):
        calibrate(host, "MagCacheCalibrate", unet, Job("flux"))


class WebSocketEvents:
    """The events of one type that the server sends its test client (``server.client_id``) over /ws."""

    def __init__(self, server, event: str) -> None:
        import threading

        self.url = server.url.replace("http://", "ws://") + f"/ws?clientId={server.client_id}"
        self.event = event
        self.received: list[dict] = []
        self.connected = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.loop = None
        self.socket = None

    def __enter__(self) -> WebSocketEvents:
        self.thread.start()
        assert self.connected.wait(20), f"no websocket connection to {self.url}"
        return self

    def __exit__(self, *exc: object) -> None:
        import asyncio

        asyncio.run_coroutine_threadsafe(self.socket.close(), self.loop).result(10)
        self.thread.join(10)

    def wait_for(self, count: int, timeout: float = 60.0) -> list[dict]:
        """The events received, once there are ``count`` (the last one may trail the prompt's end), or
        what came by the deadline: a condition, polled; the deadline only bounds a failing test."""
        import time

        deadline = time.monotonic() + timeout
        while len(self.received) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return list(self.received)

    def _run(self) -> None:
        import asyncio

        import aiohttp

        async def listen() -> None:
            self.loop = asyncio.get_running_loop()
            async with aiohttp.ClientSession() as session, session.ws_connect(self.url) as socket:
                self.socket = socket
                self.connected.set()
                async for message in socket:
                    if message.type == aiohttp.WSMsgType.TEXT:
                        data = json.loads(message.data)
                        if data.get("type") == self.event:
                            self.received.append(data["data"])

        asyncio.run(listen())


@pytest.mark.server
@pytest.mark.parametrize("node_name", ["MagCacheCalibrate", "TeaCacheCalibrate"])
def test_a_calibration_run_reports_under_its_node_like_any_run(server, node_name):
    """/stepcache/stats and the web UI's stepcache.stats event name the calibrate node (issue 13)."""
    graph = {
        "model": {"class_type": "StepCacheTestTinyModel", "inputs": {"family": "flux", "seed": 0}},
        "pos": {"class_type": "StepCacheTestConditioning", "inputs": {"family": "flux", "seed": 1, "batch": 1}},
        "neg": {"class_type": "StepCacheTestConditioning", "inputs": {"family": "flux", "seed": 2, "batch": 1}},
        "latent": {"class_type": "StepCacheTestLatent",
                   "inputs": {"family": "flux", "batch": 1, "scale": 1, "frames": 0}},
        "calibrate": {"class_type": node_name, "inputs": {
            "model": ["model", 0], "positive": ["pos", 0], "negative": ["neg", 0], "latent_image": ["latent", 0],
            "seed": 7, "steps": 10, "cfg": 3.0, "sampler_name": "euler", "scheduler": "simple", "denoise": 1.0,
            "save_calibration": False}},
        "save": {"class_type": "SaveLatent", "inputs": {"samples": ["calibrate", 0], "filename_prefix": "calib"}},
    }
    with WebSocketEvents(server, "stepcache.stats") as events:
        prompt_id = server.queue(graph)
        entry = server.wait(prompt_id, timeout=120)
        assert entry["status"]["status_str"] == "success", entry["status"]
        received = events.wait_for(1)

    (run,) = server.get(f"/stepcache/stats?prompt_id={prompt_id}")
    assert run["node"] == "calibrate" and run["method"] == "calibration", run
    assert run["steps"] == 10 and run["calls_skipped"] == 0 and run["label"].startswith("flux / ")
    (event,) = received
    assert event["node"] == "calibrate" and event["prompt_id"] == prompt_id
    assert event == run  # the same report, as the UI gets it
