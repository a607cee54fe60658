"""Where a run's statistics go: one log line per run, a message to the web UI, and an HTTP route.

Headless clients read them back with ``GET /stepcache/stats?prompt_id=<id>`` (a JSON list, one entry
per sampling run of a cached model in that prompt).
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque

from ..cache_core.stats import RunStats

LOGGER = logging.getLogger("stepcache")
STATS_EVENT = "stepcache.stats"
STATS_ROUTE = "/stepcache/stats"
_MAX_KEPT = 256

# Node id -> the stats of its most recent run (for the UI and tests), and the recent runs in order.
LAST_RUN_STATS: OrderedDict[str, dict] = OrderedDict()
RECENT_RUNS: deque[dict] = deque(maxlen=_MAX_KEPT)


def _prompt_server() -> object | None:
    try:
        from server import PromptServer
    except ImportError:  # ComfyUI used as a library, without its server
        return None
    return getattr(PromptServer, "instance", None)


def report(node_id: str | None, label: str, stats: RunStats) -> None:
    LOGGER.info("[StepCache] %s: %s", label, stats.summary())
    server = _prompt_server()
    payload = {
        "node": node_id, "label": label, "prompt_id": getattr(server, "last_prompt_id", None), **stats.as_dict()
    }
    RECENT_RUNS.append(payload)
    if node_id is None:
        return
    LAST_RUN_STATS[node_id] = payload
    LAST_RUN_STATS.move_to_end(node_id)
    while len(LAST_RUN_STATS) > _MAX_KEPT:
        LAST_RUN_STATS.popitem(last=False)
    if server is not None:
        server.send_sync(STATS_EVENT, {k: v for k, v in payload.items() if k != "trace"}, server.client_id)


def register_routes() -> None:
    """Adds the stats route to ComfyUI's server (when there is one: not when used as a library)."""
    server = _prompt_server()
    if server is None:
        return
    from aiohttp import web

    @server.routes.get(STATS_ROUTE)
    async def get_stats(request: web.Request) -> web.Response:
        prompt_id = request.query.get("prompt_id")
        runs = [
            {k: v for k, v in run.items() if k != "trace"}
            for run in RECENT_RUNS
            if prompt_id is None or run["prompt_id"] == prompt_id
        ]
        return web.json_response(runs)
