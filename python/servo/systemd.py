"""systemd's service notifications (``sd_notify``) with the standard library: no libsystemd.

A unit with ``Type=notify`` starts a service with ``$NOTIFY_SOCKET`` naming a datagram socket;
the service sends newline-separated ``KEY=VALUE`` lines to it: ``READY=1`` once it does its job
(systemd then counts it as started), ``STATUS=…`` for ``systemctl status``, ``STOPPING=1`` when a
graceful stop begins, and, with ``WatchdogSec=``, ``WATCHDOG=1`` at least every
``$WATCHDOG_USEC`` µs or systemd ends and (with ``Restart=``) restarts it. The address is a path,
or ``@name`` for Linux's abstract namespace (a leading NUL byte on the wire).

`Notifier` only sends, never blocks and never raises: without ``$NOTIFY_SOCKET`` there is no
notifier, and a datagram that cannot be sent (no manager listening any more, a full queue) is
dropped with one warning. What counts as healthy is the caller's business (`servo.cli.notify`):
pings must come from the work being watched, or the watchdog would only watch the pinging.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from servo.logs import get_logger

log = get_logger(__name__)

#: Pings per watchdog timeout: systemd's own advice is to ping at half the timeout.
PINGS_PER_TIMEOUT = 2


class Notifier:
    """Sends notifications to the service manager. Any thread may call it (one ``sendto`` each).

    Args:
        address: The socket's path, or ``@name`` for an abstract one (as in ``$NOTIFY_SOCKET``).
        watchdog_s: The watchdog timeout (``$WATCHDOG_USEC``), or None when none is set.
    """

    def __init__(self, address: str, watchdog_s: float | None = None) -> None:
        self.address = address
        self.watchdog_s = watchdog_s
        self._wire = "\0" + address[1:] if address.startswith("@") else address
        self._warned = False

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> Notifier | None:
        """The notifier ``$NOTIFY_SOCKET`` asks for, or None when the process is not run that way.

        The watchdog applies only when ``$WATCHDOG_PID`` is unset or names this process (a child
        that inherited the variables must not ping for its parent). Addresses other than a path or
        an abstract name (``vsock:…``, which a virtual machine's manager uses) are not supported:
        they are ignored with a warning.
        """
        address = environ.get("NOTIFY_SOCKET", "")
        if not address:
            return None
        if not address.startswith(("/", "@")):
            log.warning("NOTIFY_SOCKET is not a Unix socket path: not notifying systemd", address=address)
            return None
        watchdog_s = None
        pid = environ.get("WATCHDOG_PID", "")
        usec = environ.get("WATCHDOG_USEC", "")
        if usec and (not pid or pid == str(os.getpid())):
            try:
                watchdog_s = int(usec) / 1e6 if int(usec) > 0 else None
            except ValueError:
                log.warning("WATCHDOG_USEC is not a number of microseconds: no watchdog pings", value=usec)
        return cls(address, watchdog_s)

    @property
    def ping_interval_s(self) -> float | None:
        """How often to send ``WATCHDOG=1`` (half the timeout), or None without a watchdog."""
        return None if self.watchdog_s is None else self.watchdog_s / PINGS_PER_TIMEOUT

    def send(self, *lines: str) -> bool:
        """Send ``KEY=VALUE`` lines as one datagram; False (and one warning ever) if it was lost."""
        try:
            # A socket per message (a few a second at most): nothing to close, nothing inherited.
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK) as s:
                s.sendto("\n".join(lines).encode(), self._wire)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("cannot notify systemd", address=self.address, error=exc.strerror or str(exc))
            return False
        return True
