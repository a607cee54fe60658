"""Where a run's statistics go: one log line per run, and a message for the web extension."""

from __future__ import annotations

import logging
from collections import OrderedDict

from ..cache_core.stats import RunStats

LOGGER = logging.getLogger("stepcache")
STATS_EVENT = "stepcache.stats"
_MAX_KEPT = 64

# Node id -> the stats of its most recent run, for the UI and for tests (bounded).
LAST_RUN_STATS: OrderedDict[str, dict] = OrderedDict()


def report(node_id: str | None, label: str, stats: RunStats) -> None:
    LOGGER.info("[StepCache] %s: %s", label, stats.summary())
    if node_id is None:
        return
    payload = {"node": node_id, "label": label, **stats.as_dict()}
    LAST_RUN_STATS[node_id] = payload
    LAST_RUN_STATS.move_to_end(node_id)
    while len(LAST_RUN_STATS) > _MAX_KEPT:
        LAST_RUN_STATS.popitem(last=False)
    _send_to_ui(payload)


def _send_to_ui(payload: dict) -> None:
    try:
        from server import PromptServer
    except ImportError:  # ComfyUI used as a library, without its server
        return
    instance = getattr(PromptServer, "instance", None)
    if instance is not None:
        instance.send_sync(STATS_EVENT, payload, instance.client_id)
