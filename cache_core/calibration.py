"""Calibration: a model's own MagCache ratios and TeaCache polynomial, measured in a real run.

A calibration run computes every step (``methods.CalibrationRunConfig``) while a ``ResidualRecorder``,
handed to that run's cache, watches it. Per step and CFG branch it keeps:

- the MagCache magnitude ratio, mean over tokens of ||r_t|| / ||r_{t-1}|| of the stack residual r,
  with its spread (standard deviation over tokens) and the cosine distance between r_t and r_{t-1};
- the relative L1 change of the residual, mean|r_t - r_{t-1}| / mean|r_{t-1}|, which is what reusing
  the previous step's residual gets wrong, and the relative change of the TeaCache signal. The
  TeaCache polynomial is fitted to predict the first from the second.

It also measures, on the CFG-combined residual cfg * cond - (cfg - 1) * uncond (what the sampler
uses), what skipping each step would have cost with reuse and with a first-order forecast, for
gaps of several steps (``planning.SkipError``): the planned rule's error model is fitted to those;
and the second moments of that residual between every pair of steps (``moments.ResidualMoments``),
from which the optimal_linear estimator solves its weights and the planned rule its exact errors.

Only the first evaluation of each step is measured (multi-call samplers evaluate between steps).
A ``Calibration`` also names the model it was measured on and the schedule it was measured with,
and round-trips through JSON, refusing anything malformed with a message that says what is wrong.
This module is data: it knows no method. What a method needs of its calibration, and what it fits
from the measurements, is the method's own (``methods.CALIBRATED_METHODS``: ``fitted``,
``check_calibration``, called where a calibration is made and used).
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from .measurement import sample_rows
from .moments import ResidualMoments
from .planning import MEASURED_BACK, MEASURED_FORWARD, ErrorModel, SkipError
from .ratios import MagRatios
from .schedule import RunSchedule
from .stats import branch_name


class CalibrationError(ValueError):
    """A calibration that cannot be used, with the reason in words."""


# The methods a calibration can be of, by their name in the file, as reports name them.
METHOD_NAMES = {"magcache": "MagCache", "teacache": "TeaCache"}

# Version 2 added the skip errors (and the guidance scale they were measured at), version 3 the
# residual moments; earlier calibrations still load, without them.
FORMAT_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
# The skip errors are measured on at most this many tokens per row, evenly spread: relative
# errors need no more, and the calibration run keeps several steps of them.
ERROR_TOKENS = 4096


@dataclass(frozen=True)
class StepRecord:
    step: int
    branch: int
    magnitude_ratio: float
    ratio_spread: float
    cosine_distance: float
    residual_change: float
    signal_change: float | None = None


class ResidualRecorder:
    """A ``RunObserver`` collecting ``StepRecord``s from one measuring run."""

    def __init__(self, channels_last: bool = True, cfg: float = 1.0) -> None:
        # Block-stack residuals are [batch, tokens, channels]; output-space ones [batch, C, ...].
        self.channels_last = channels_last
        self.cfg = cfg
        self.schedule: RunSchedule | None = None
        self.records: list[StepRecord] = []
        self.skip_errors: list[SkipError] = []
        self._previous: dict[int, torch.Tensor] = {}
        self._recorded: set[tuple[int, int]] = set()
        self._signal: dict[tuple[int, int], float] = {}
        # This step's residual per branch (token subsample), combined when the next step starts.
        self._pending_step = -1
        self._pending: dict[int, torch.Tensor] = {}
        self._combined: deque[tuple[int, torch.Tensor]] = deque(maxlen=MEASURED_FORWARD + MEASURED_BACK)
        self._moment_samples: dict[int, torch.Tensor] = {}  # step -> [rows, n] sample of its combined residual

    def start(self, schedule: RunSchedule) -> None:
        self.schedule = schedule

    def finish(self) -> None:
        """After the run: record the last step."""
        self._combine_pending()

    def signal_changes(self, step: int, branches: tuple[int, ...], changes: list[float]) -> None:
        for branch, change in zip(branches, changes, strict=True):
            self._signal.setdefault((step, branch), change)

    def residual(self, step: int, branches: tuple[int, ...], residual: torch.Tensor) -> None:
        rows = residual.shape[0] // len(branches)
        for index, branch in enumerate(branches):
            if (step, branch) in self._recorded:
                continue
            self._recorded.add((step, branch))
            current = self._tokens(residual[index * rows:(index + 1) * rows])
            previous, self._previous[branch] = self._previous.get(branch), current
            if previous is not None and previous.shape == current.shape:
                self.records.append(self._record(step, branch, current, previous))
            if step != self._pending_step:
                self._combine_pending()
                self._pending_step = step
            self._pending[branch] = current[:, ::max(1, -(-current.shape[1] // ERROR_TOKENS))]

    def _combine_pending(self) -> None:
        """The finished step's CFG-combined residual, and what skipping it would have cost."""
        pending, self._pending = self._pending, {}
        if not pending or self.schedule is None:
            return
        step = self._pending_step
        if 0 in pending and 1 in pending and pending[0].shape == pending[1].shape:
            combined = self.cfg * pending[0] - (self.cfg - 1.0) * pending[1]
        else:
            combined = pending[min(pending)]
        # The moments need only a sample: a stride coprime with the channels, so every channel is in it.
        self._moment_samples[step] = sample_rows(combined, combined.shape[0]).double()
        earlier = {s: r for s, r in self._combined if r.shape == combined.shape}
        self._combined.append((step, combined))
        times = self.schedule.step_times
        keys, estimates = [], []
        for forward in range(1, MEASURED_FORWARD + 1):
            last = earlier.get(step - forward)
            if last is None:
                break
            keys.append((0, forward, 0))
            estimates.append(last)
            for back in range(1, MEASURED_BACK + 1):
                first = earlier.get(step - forward - back)
                if first is None:
                    break
                t0, t1 = times[step - forward - back], times[step - forward]
                keys.append((1, forward, back))
                estimates.append(last + (last - first) * ((times[step] - t1) / (t1 - t0)))
        if not keys:
            return
        scale = combined.norm().clamp_min(1e-12)
        # One transfer to the host for the step.
        errors = torch.stack([(combined - e).norm() / scale for e in estimates]).tolist()
        self.skip_errors += [SkipError(step, order, forward, back, error)
                             for (order, forward, back), error in zip(keys, errors, strict=True)]

    def moments(self) -> ResidualMoments | None:
        """After the run: the second moments of the combined residual over every step, or None
        where a step is missing or changed shape (nothing to interpolate between)."""
        if self.schedule is None:
            return None
        steps = self.schedule.steps
        samples = [self._moment_samples.get(step) for step in range(steps)]
        if steps < 3 or any(s is None or s.shape != samples[0].shape for s in samples):
            return None
        stacked = torch.stack(samples)  # [steps, rows, n]
        gram = torch.einsum("irn,jrn->ij", stacked, stacked) / (stacked.shape[1] * stacked.shape[2])
        return ResidualMoments.from_gram(self.schedule.progress[:steps], gram.cpu().numpy())

    def _tokens(self, residual: torch.Tensor) -> torch.Tensor:
        """[rows, tokens, channels], float32, a private copy."""
        r = residual.detach().float()
        if not self.channels_last:
            r = r.movedim(1, -1)
        return r.reshape(r.shape[0], -1, r.shape[-1]).clone()

    def _record(self, step: int, branch: int, current: torch.Tensor, previous: torch.Tensor) -> StepRecord:
        ratios = current.norm(dim=-1) / previous.norm(dim=-1).clamp_min(1e-12)
        cosine = torch.nn.functional.cosine_similarity(current.reshape(1, -1), previous.reshape(1, -1))[0]
        change = (current - previous).abs().mean() / previous.abs().mean().clamp_min(1e-12)
        # One transfer to the host for the four figures, not one sync each.
        mean, spread, cosine, change = torch.stack([ratios.mean(), ratios.std(), cosine, change]).tolist()
        return StepRecord(
            step=step, branch=branch, magnitude_ratio=mean, ratio_spread=spread,
            cosine_distance=1.0 - cosine, residual_change=change, signal_change=self._signal.get((step, branch)),
        )


@dataclass(frozen=True)
class ModelIdentity:
    """What a calibration is tied to."""

    family: str
    variant: str
    model_class: str
    hidden_size: int
    fingerprint: str  # of the weights

    def mismatch(self, other: ModelIdentity) -> str | None:
        if self.family != other.family:
            return f"it was measured on a {self.family} model, this is a {other.family} model"
        if self.model_class != other.model_class or self.hidden_size != other.hidden_size:
            return (f"it was measured on a {self.model_class} of width {self.hidden_size}, this model is a "
                    f"{other.model_class} of width {other.hidden_size}")
        if self.fingerprint != other.fingerprint:
            return "it was measured on other weights (another checkpoint of the same architecture)"
        return None


@dataclass(frozen=True)
class ScheduleInfo:
    """The schedule a calibration was measured with."""

    steps: int
    sampler: str
    scheduler: str
    denoise: float
    progress: tuple[float, ...]  # model-time position of each step


@dataclass(frozen=True)
class Calibration:
    method: str  # a key of METHOD_NAMES (and of methods.CALIBRATED_METHODS)
    model: ModelIdentity
    schedule: ScheduleInfo
    records: tuple[StepRecord, ...]  # saved under the JSON key "measures" (the file format is unchanged)
    coefficients: tuple[float, ...] | None = None  # TeaCache: fitted polynomial
    # TeaCache: (signal change, residual change) of every run it was fitted over.
    fit_points: tuple[tuple[float, float], ...] = ()
    created: str = ""
    runs: int = 1
    # What skipping each step would have cost (planned rule), and the guidance scale of the run.
    skip_errors: tuple[SkipError, ...] = ()
    cfg: float | None = None
    # Second moments of the CFG-combined residual between the steps (optimal_linear, planned rule).
    moments: ResidualMoments | None = None
    version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        self.validate()

    # -- what it gives ---------------------------------------------------------------------

    @property
    def branches(self) -> tuple[int, ...]:
        return tuple(sorted({m.branch for m in self.records}))

    def per_step(self, branch: int, field_name: str, first: float) -> list[float]:
        by_step = {m.step: getattr(m, field_name) for m in self.records if m.branch == branch}
        return [first] + [by_step[step] for step in range(1, self.schedule.steps)]

    def mag_ratios(self) -> MagRatios:
        return MagRatios.from_measured(
            [self.per_step(b, "magnitude_ratio", 1.0) for b in self.branches], self.schedule.progress,
            source=f"calibration of {self.created} ({self.schedule.steps} steps, {self.schedule.sampler})",
            cosine_distances=[self.per_step(b, "cosine_distance", 0.0) for b in self.branches],
        )

    def error_model(self, order: int) -> ErrorModel | None:
        """The planned rule's error model for reuse (0) or a first-order forecast (1); None for a
        calibration without skip errors (made before they were measured)."""
        return ErrorModel.fit(self.skip_errors, self.schedule.progress, order)

    def summary(self) -> str:
        lines = [
            f"{METHOD_NAMES[self.method]} calibration of a {self.model.family} model "
            f"({self.model.variant}, {self.model.model_class}, width {self.model.hidden_size}, "
            f"weights {self.model.fingerprint[:12]})",
            f"measured {self.created} over {self.runs} run(s): {self.schedule.steps} steps, {self.schedule.sampler} / "
            f"{self.schedule.scheduler}, denoise {self.schedule.denoise:g}",
        ]
        for branch in self.branches:
            ratios = self.per_step(branch, "magnitude_ratio", 1.0)
            spread = self.per_step(branch, "ratio_spread", 0.0)
            cosine = self.per_step(branch, "cosine_distance", 0.0)
            lines.append(f"{branch_name(branch)} ratios: " + ", ".join(f"{r:.5f}" for r in ratios))
            lines.append(f"{branch_name(branch)} spread (std over tokens): " + ", ".join(f"{s:.4f}" for s in spread))
            lines.append(f"{branch_name(branch)} cosine distance: " + ", ".join(f"{c:.4f}" for c in cosine))
        for order, name in ((0, "reuse"), (1, "first-order forecast")):
            model = self.error_model(order)
            if model is not None:
                lines.append(f"skip error ({name}, cfg {self.cfg:g}) = kappa(progress) x gap^{model.alpha:.2f}"
                             + (f" x anchor spacing^{model.beta:.2f}" if order else "") + "; kappa: "
                             + ", ".join(f"{math.exp(v):.3g}" for v in model.log_kappa))
        if self.coefficients is not None:
            lines.append("TeaCache coefficients (poly1d, highest power first): "
                         + ", ".join(f"{c:.8g}" for c in self.coefficients))
        return "\n".join(lines)

    # -- checks ----------------------------------------------------------------------------

    def validate(self) -> None:
        if self.method not in METHOD_NAMES:
            raise CalibrationError(f"unknown calibration method {self.method!r}")
        steps = self.schedule.steps
        if steps < 2 or len(self.schedule.progress) != steps:
            raise CalibrationError(f"the schedule must list one position per step ({steps} steps)")
        if any(b <= a for a, b in itertools.pairwise(self.schedule.progress)):
            raise CalibrationError("the schedule positions must increase")
        if not self.records:
            raise CalibrationError("the calibration is empty: no step was measured")
        for record in self.records:
            values = (record.magnitude_ratio, record.ratio_spread, record.cosine_distance, record.residual_change)
            if not all(math.isfinite(v) for v in values) or record.magnitude_ratio <= 0:
                raise CalibrationError(f"step {record.step} has a non-finite or non-positive measurement")
            if not 0 < record.step < steps:
                raise CalibrationError(f"step {record.step} is outside the {steps}-step schedule")
        for branch in self.branches:
            seen = {m.step for m in self.records if m.branch == branch}
            missing = sorted(set(range(1, steps)) - seen)
            if missing:
                raise CalibrationError(f"branch {branch} misses steps {missing[:5]}")
        for error in self.skip_errors:
            if not (math.isfinite(error.error) and error.error >= 0.0):
                raise CalibrationError(f"step {error.step} has a non-finite skip error")
            in_schedule = error.forward > 0 and error.forward + error.back <= error.step < steps
            if error.order not in (0, 1) or not in_schedule:
                raise CalibrationError(f"a skip error of step {error.step} names steps outside the schedule")
        if self.cfg is not None and not math.isfinite(self.cfg):
            raise CalibrationError("the guidance scale is not finite")
        if self.moments is not None:
            problem = self.moments.validate()
            if problem is None and len(self.moments.progress) != steps:
                problem = f"the residual moments cover {len(self.moments.progress)} steps, not {steps}"
            if problem is not None:
                raise CalibrationError(problem)

    # -- JSON ------------------------------------------------------------------------------

    def to_json(self) -> dict:
        return {
            "format": "stepcache-calibration", "version": self.version, "method": self.method,
            "created": self.created, "runs": self.runs, "model": asdict(self.model),
            "schedule": asdict(self.schedule),
            "measures": [asdict(m) for m in self.records],
            "coefficients": list(self.coefficients) if self.coefficients is not None else None,
            "fit_points": [list(point) for point in self.fit_points],
            "skip_errors": [asdict(e) for e in self.skip_errors], "cfg": self.cfg,
            "moments": asdict(self.moments) if self.moments is not None else None,
        }

    @classmethod
    def from_json(cls, data: Mapping) -> Calibration:
        try:
            if data.get("format") != "stepcache-calibration":
                raise CalibrationError("not a StepCache calibration")
            if data.get("version") not in READABLE_VERSIONS:
                raise CalibrationError(f"calibration format version {data.get('version')} is not one of "
                                       f"{', '.join(map(str, READABLE_VERSIONS))}")
            schedule = dict(data["schedule"])
            schedule["progress"] = tuple(float(p) for p in schedule["progress"])
            coefficients = data.get("coefficients")
            return cls(
                method=data["method"], model=ModelIdentity(**data["model"]),
                schedule=ScheduleInfo(**schedule),
                records=tuple(StepRecord(**m) for m in data["measures"]),
                coefficients=tuple(float(c) for c in coefficients) if coefficients is not None else None,
                fit_points=tuple((float(x), float(y)) for x, y in data.get("fit_points", ())),
                created=str(data.get("created", "")), runs=int(data.get("runs", 1)),
                skip_errors=tuple(SkipError(**e) for e in data.get("skip_errors", ())),
                cfg=float(data["cfg"]) if data.get("cfg") is not None else None,
                moments=_moments_from_json(data.get("moments")),
            )
        except CalibrationError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise CalibrationError(f"malformed calibration ({error!r})") from error


def _moments_from_json(data: Mapping | None) -> ResidualMoments | None:
    if data is None:
        return None
    return ResidualMoments(progress=tuple(float(v) for v in data["progress"]),
                           coordinates=tuple(tuple(float(v) for v in row) for row in data["coordinates"]))


def teacache_fit_points(records: Sequence[StepRecord]) -> tuple[tuple[float, float], ...]:
    return tuple((m.signal_change, m.residual_change) for m in records if m.signal_change is not None)


def fit_teacache_polynomial(points: Sequence[tuple[float, float]], degree: int = 4) -> tuple[float, ...]:
    """Least-squares polynomial (numpy poly1d order) from signal change to residual change."""
    if len(points) < degree + 2:
        raise CalibrationError(f"need at least {degree + 2} measured steps to fit a degree-{degree} polynomial, "
                               f"got {len(points)}")
    x, y = np.array(points, dtype=np.float64).T
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise CalibrationError("non-finite measurements")
    return tuple(float(c) for c in np.polyfit(x, y, degree))
