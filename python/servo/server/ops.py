"""HTTP health and Prometheus metrics: ``GET /healthz`` and ``GET /metrics``.

A deliberately tiny HTTP/1.1 responder on anyio: two read-only endpoints do not justify a web
framework in the server's dependency tree.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
from anyio.abc import SocketStream, TaskStatus

from servo.logs import get_logger

log = get_logger(__name__)

_MAX_REQUEST = 8192
_REASONS = {
    200: "OK",
    404: "Not Found",
    405: "Method Not Allowed",
    400: "Bad Request",
    503: "Service Unavailable",
}


class OpsEndpoint:
    """Serves health and metrics. Owned by the event loop.

    Args:
        health: Returns ``(ready, state)``: 200 with the state when ready, 503 otherwise.
        metrics: Returns the Prometheus exposition.
    """

    def __init__(self, health: Callable[[], tuple[bool, str]], metrics: Callable[[], bytes]) -> None:
        self._health = health
        self._metrics = metrics

    async def run(self, host: str, port: int, *, task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled; reports the bound port through ``task_status``."""
        try:
            listener = await anyio.create_tcp_listener(local_host=host, local_port=port, reuse_port=False)
        except OSError as exc:
            # The OS error alone does not say which of the server's ports it means.
            raise OSError(exc.errno, f"health port {port} on {host}: {exc.strerror}") from exc
        async with listener:
            bound = listener.extra(anyio.abc.SocketAttribute.local_port)
            log.info("ops endpoint listening", url=f"http://{host}:{bound}/healthz")
            task_status.started(bound)
            await listener.serve(self._handle)

    async def _handle(self, stream: SocketStream) -> None:
        async with stream:
            try:
                with anyio.fail_after(5):
                    request = b""
                    while b"\r\n\r\n" not in request and len(request) < _MAX_REQUEST:
                        request += await stream.receive(4096)
                status, content_type, body = self._route(request)
                head = (
                    f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                )
                await stream.send(head.encode() + body)
            except (TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                return

    def _route(self, request: bytes) -> tuple[int, str, bytes]:
        line = request.split(b"\r\n", 1)[0].decode("latin-1").split()
        if len(line) < 2:
            return 400, "text/plain", b"bad request\n"
        method, path = line[0], line[1].split("?", 1)[0]
        if method != "GET":
            return 405, "text/plain", b"only GET\n"
        if path == "/healthz":
            ready, state = self._health()
            return (200 if ready else 503), "text/plain", f"{state}\n".encode()
        if path == "/metrics":
            return 200, "text/plain; version=0.0.4; charset=utf-8", self._metrics()
        return 404, "text/plain", b"not found\n"
