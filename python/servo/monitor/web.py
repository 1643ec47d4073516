"""The monitor's HTTP side: the page (plain HTML/JS/CSS shipped in the package), its JSON, /metrics.

=================  ==============================================================
``/``              the fleet page (``static/index.html``; no build step)
``/static/NAME``   its script and style sheet
``/api/fleet``     replicas, robots, recent events (`FleetView.snapshot`)
``/api/robot``     ``?id=ROBOT``: its transitions and samples, and its recent requests
                   from every replica's audit queryable
``/metrics``       Prometheus (`servo.monitor.exporter`)
``/healthz``       200 once the monitor has joined the network
=================  ==============================================================

Read-only: nothing on this port can change the fleet. It listens on 127.0.0.1 unless told
otherwise (``servo-monitor --http-host``).
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import anyio
from anyio.abc import TaskStatus

from servo.httpd import PROMETHEUS, HttpEndpoint, Response, text
from servo.monitor.collector import FleetCollector
from servo.monitor.exporter import FleetExporter
from servo.wire import WireError, segment

_STATIC = {
    "index.html": "text/html; charset=utf-8",
    "monitor.js": "text/javascript; charset=utf-8",
    "monitor.css": "text/css; charset=utf-8",
}


def static_file(name: str) -> bytes:
    """A file of the page, read from the installed package."""
    return resources.files("servo.monitor").joinpath("static", name).read_bytes()


class MonitorWeb:
    """Serves the page and its data. Owned by the monitor's event loop.

    Args:
        collector: Reaches the fleet (its view, and the replicas' audit on demand).
        exporter: The Prometheus view of the same data.
    """

    def __init__(self, collector: FleetCollector, exporter: FleetExporter) -> None:
        self.collector = collector
        self.exporter = exporter
        self._http = HttpEndpoint(self._route, what="monitor port")
        self._files = {name: static_file(name) for name in _STATIC}

    async def run(self, host: str, port: int, *, task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled; reports the bound port through ``task_status``."""
        await self._http.run(host, port, task_status=task_status)

    async def _route(self, path: str, params: dict[str, str]) -> Response:
        if path in ("/", "/index.html"):
            return 200, _STATIC["index.html"], self._files["index.html"]
        if path.startswith("/static/") and (name := path.removeprefix("/static/")) in _STATIC:
            return 200, _STATIC[name], self._files[name]
        if path == "/api/fleet":
            return _json(self.collector.view.snapshot())
        if path == "/api/robot":
            return await self._robot(params.get("id", ""))
        if path == "/metrics":
            return 200, PROMETHEUS, self.exporter.render()
        if path == "/healthz":
            return text(200, "ok\n")
        return text(404, "not found\n")

    async def _robot(self, robot: str) -> Response:
        try:
            segment(robot, what="id")
        except WireError as exc:
            return text(400, f"{exc}\n")
        timeline = self.collector.view.timeline(robot)
        if timeline is None:
            return text(404, f"no telemetry from {robot!r}\n")
        timeline["requests"] = await self.collector.requests(robot)
        return _json(timeline)


def _json(data: Any) -> Response:
    return 200, "application/json", json.dumps(data, allow_nan=False).encode()
