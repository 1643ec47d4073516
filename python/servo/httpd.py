"""A deliberately tiny HTTP/1.1 responder on anyio, for read-only endpoints.

The server's health and metrics (`servo.server.ops`) and the fleet monitor's page and JSON
(`servo.monitor.web`) need a few GET routes each: not a web framework in every dependency tree.
One request per connection, a bounded request head, a deadline per connection, at most
`MAX_CONNECTIONS` connections at once (more are closed unanswered: nobody holds the process's file
descriptors by opening connections and sending nothing); anything but GET is refused.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from urllib.parse import parse_qs, unquote, urlsplit

import anyio
from anyio.abc import SocketStream, TaskStatus

from servo.logs import get_logger

log = get_logger(__name__)

_MAX_REQUEST = 8192
#: Connections served at once per endpoint (a scraper, a probe, a few browsers); more are closed at once.
MAX_CONNECTIONS = 64
REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}

#: The Prometheus text exposition format.
PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"
#: ``(status, content type, body)``.
Response = tuple[int, str, bytes]
#: Answers one GET: the decoded path and its query parameters (the last value of each).
Handler = Callable[[str, dict[str, str]], Awaitable[Response]]


def text(status: int, body: str) -> Response:
    """A plain-text response."""
    return status, "text/plain; charset=utf-8", body.encode()


class HttpEndpoint:
    """Serves GET requests with ``handler``. Owned by the event loop.

    Args:
        handler: Answers one request.
        what: What the port is, for errors and logs (``health port``, ``monitor port``).
    """

    def __init__(self, handler: Handler, *, what: str) -> None:
        self._handler = handler
        self._what = what
        self._open = 0

    async def run(self, host: str, port: int, *, task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled; reports the bound port through ``task_status``.

        Raises:
            OSError: the port cannot be bound; the message names it (``health port 9100 on …``).
        """
        try:
            listener = await anyio.create_tcp_listener(local_host=host, local_port=port, reuse_port=False)
        except OSError as exc:
            # The OS error alone does not say which of the process's ports it means.
            raise OSError(exc.errno, f"{self._what} {port} on {host}: {exc.strerror}") from exc
        async with listener:
            bound = listener.extra(anyio.abc.SocketAttribute.local_port)
            log.info("http endpoint listening", what=self._what, url=f"http://{host}:{bound}/")
            task_status.started(bound)
            await listener.serve(self._handle)

    async def _handle(self, stream: SocketStream) -> None:
        async with stream:
            if self._open >= MAX_CONNECTIONS:
                return
            self._open += 1
            try:
                with anyio.fail_after(5):
                    request = b""
                    while b"\r\n\r\n" not in request and len(request) < _MAX_REQUEST:
                        request += await stream.receive(4096)
                    status, content_type, body = await self._route(request)
                head = (
                    f"HTTP/1.1 {status} {REASONS[status]}\r\nContent-Type: {content_type}\r\n"
                    f"Content-Length: {len(body)}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n"
                )
                await stream.send(head.encode() + body)
            except (TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                return
            finally:
                self._open -= 1

    async def _route(self, request: bytes) -> Response:
        line = request.split(b"\r\n", 1)[0].decode("latin-1").split()
        if len(line) < 2:
            return text(400, "bad request\n")
        method, target = line[0], urlsplit(line[1])
        if method != "GET":
            return text(405, "only GET\n")
        params = {key: values[-1] for key, values in parse_qs(target.query).items()}
        try:
            return await self._handler(unquote(target.path), params)
        except Exception:  # a handler bug costs one request, never the endpoint
            log.exception("http handler failed", what=self._what, path=target.path[:200])
            return text(400, "bad request\n")
