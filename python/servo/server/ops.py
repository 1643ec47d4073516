"""HTTP health and Prometheus metrics: ``GET /healthz`` and ``GET /metrics`` (`servo.httpd`)."""

from __future__ import annotations

from collections.abc import Callable

import anyio
from anyio.abc import TaskStatus

from servo.httpd import PROMETHEUS, HttpEndpoint, Response, text


class OpsEndpoint:
    """Serves health and metrics. Owned by the event loop.

    Args:
        health: Returns ``(ready, state)``: 200 with the state when ready, 503 otherwise.
        metrics: Returns the Prometheus exposition.
    """

    def __init__(self, health: Callable[[], tuple[bool, str]], metrics: Callable[[], bytes]) -> None:
        self._health = health
        self._metrics = metrics
        self._http = HttpEndpoint(self._route, what="health port")

    async def run(self, host: str, port: int, *, task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled; reports the bound port through ``task_status``."""
        await self._http.run(host, port, task_status=task_status)

    async def _route(self, path: str, params: dict[str, str]) -> Response:
        if path == "/healthz":
            ready, state = self._health()
            return text(200 if ready else 503, f"{state}\n")
        if path == "/metrics":
            return 200, PROMETHEUS, self._metrics()
        return text(404, "not found\n")
