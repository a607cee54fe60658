"""Prompt-time checks, so bad input is a validation error under the input it is about, never a crash.

How ComfyUI (0.3.75 and 0.30.0 alike) validates a node's widget values when a prompt is queued:

- it checks each value itself (conversion to the input's type, min/max, combo options) and reports
  a bad one once, under that input, but only for inputs that the node's ``validate_inputs`` does
  not take by name;
- it lists whatever ``validate_inputs`` returns under every input that function takes: under all
  of the node's inputs, links included, when it takes ``**kwargs``.

So a node of this pack leaves every single-value check to ComfyUI, and only a rule that relates
several inputs gets a ``validate_inputs``, taking exactly those inputs (``check_related``): its
message is listed under them and no other. Two gaps in ComfyUI's own checks are closed here:

- it does not refuse NaN (NaN compares false with any bound): FLOAT inputs get bounds that NaN lies
  outside of (``finite_range``);
- 0.3.75 checks a combo's value only when the combo's type is its list of options, ComfyUI's
  original form, not for a V3 combo (type "COMBO"): the pack's combos use that form (``Choice``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from comfy_api.latest import io


class FiniteBound(float):
    """A FLOAT input's min or max that NaN lies outside of.

    ComfyUI refuses a value ``v`` with ``v < min`` or ``v > max``; with a bound of this type on the
    right, Python asks the bound (a float subclass overriding the reflected comparison), which
    answers true for NaN. Any other number compares as with a plain float, and JSON (object_info)
    shows the plain number.
    """

    def __gt__(self, other: object) -> bool:  # `value < min`
        return _is_nan(other) or float.__gt__(self, other)

    def __lt__(self, other: object) -> bool:  # `value > max`
        return _is_nan(other) or float.__lt__(self, other)


def _is_nan(value: object) -> bool:
    return isinstance(value, float) and math.isnan(value)


class ComboOptions(list):
    """A combo's options as its input type: a list, which 0.3.75 checks values against, that can
    also be a dict key (0.30.0 looks every input type up among its dynamic input types)."""

    def __hash__(self) -> int:
        return hash(tuple(self))


class Choice(io.Combo.Input):
    """A combo input whose type is its list of options (ComfyUI's original combo form), so that
    every supported ComfyUI checks its value itself. The frontend shows it as any combo."""

    def get_io_type(self) -> ComboOptions:
        return ComboOptions(self.options)


def _has_advanced_inputs() -> bool:
    import inspect

    return "advanced" in inspect.signature(io.Float.Input.__init__).parameters


# Where the host's V3 schema has "advanced" inputs (0.30.0), the frontend folds them away behind
# the node's main inputs; older hosts (0.3.75) show them as any other input.
ADVANCED: dict[str, bool] = {"advanced": True} if _has_advanced_inputs() else {}


def finite_range(low: float, high: float) -> dict[str, FiniteBound]:
    """``min`` and ``max`` for an ``io.Float.Input``, refusing NaN as well as values outside them."""
    return {"min": FiniteBound(low), "max": FiniteBound(high)}


def widget_problem(inputs: list, values: dict[str, Any]) -> str | None:
    """The first value outside its input's declared range or options, described; None if all fit."""
    for spec in inputs:
        if spec.id not in values:
            continue
        value = values[spec.id]
        if isinstance(spec, io.Int.Input | io.Float.Input):
            if not math.isfinite(value):
                return f"{spec.id}: {value} is not a finite number"
            if spec.min is not None and value < spec.min:
                return f"{spec.id}: {value} is below the minimum {spec.min}"
            if spec.max is not None and value > spec.max:
                return f"{spec.id}: {value} is above the maximum {spec.max}"
        elif isinstance(spec, io.Combo.Input) and value not in spec.options:
            return f"{spec.id}: {value!r} is not one of {', '.join(map(str, spec.options))}"
    return None


def _unchecked_number(spec: object, value: object) -> bool:
    """A numeric input whose value ComfyUI could not convert (it said so under that input) or a
    link (no value before the run: ComfyUI passes None)."""
    if not isinstance(spec, io.Int.Input | io.Float.Input):
        return False
    return value is None or isinstance(value, bool) or not isinstance(value, int | float)


def check_related(node: type[io.ComfyNode], rule: Callable[..., str | None], **values: Any) -> bool | str:
    """The body of a ``validate_inputs`` that takes the inputs of one rule (``values``, by name).

    ComfyUI skips its own checks for the inputs validate_inputs takes, so each is checked against
    its schema here, then the rule between them. The answer is listed under each of these inputs.
    """
    # define_schema, not GET_SCHEMA: validation runs on a locked class clone that cannot cache it.
    specs = [spec for spec in node.define_schema().inputs if spec.id in values]
    if any(_unchecked_number(spec, values[spec.id]) for spec in specs):
        return True  # reported by ComfyUI already, or checked when the node runs
    problem = widget_problem(specs, values) or rule(**values)
    return True if problem is None else problem
