"""Prompt-time checks of every widget value, so bad input is a validation error, never a crash.

ComfyUI checks numeric ranges and combo options itself only for inputs that a node's
``validate_inputs`` does not take, and not at all once it takes ``**kwargs``; it never refuses NaN
(NaN compares false with any bound). So every node of the pack takes all its values here: each
is checked against its own schema (finite, within min/max, one of the options), then the node's
own rules (``check_inputs``) run.
"""

from __future__ import annotations

import math
from typing import Any

from comfy_api.latest import io


def widget_problem(inputs: list, values: dict[str, Any]) -> str | None:
    """The first widget value outside its declared type, range or options, described."""
    for spec in inputs:
        if spec.id not in values:
            continue  # a link, or an optional input left out
        value = values[spec.id]
        if isinstance(spec, io.Int.Input | io.Float.Input):
            if isinstance(value, bool) or not isinstance(value, int | float):
                return f"{spec.id}: {value!r} is not a number"
            if not math.isfinite(value):
                return f"{spec.id}: {value} is not a finite number"
            if spec.min is not None and value < spec.min:
                return f"{spec.id}: {value} is below the minimum {spec.min}"
            if spec.max is not None and value > spec.max:
                return f"{spec.id}: {value} is above the maximum {spec.max}"
        elif isinstance(spec, io.Combo.Input) and value not in spec.options:
            return f"{spec.id}: {value!r} is not one of {', '.join(map(str, spec.options))}"
    return None


class ValidatedNode(io.ComfyNode):
    """Base of the pack's nodes: every widget value is checked when the prompt is queued."""

    @classmethod
    def validate_inputs(cls, **values: Any) -> bool | str:
        # define_schema, not GET_SCHEMA: validation runs on a locked class clone that cannot cache it.
        problem = widget_problem(cls.define_schema().inputs, values) or cls.check_inputs(**values)
        return True if problem is None else problem

    @classmethod
    def check_inputs(cls, **values: Any) -> str | None:
        """The node's own rules between values that are each valid; None when they hold."""
        return None
