"""The QoS table of the protocol (docs/design/protocol.md §3), in one place.

Observations: congestion BLOCK, normal priority. There is one observation in flight per
session, and a DROP publisher drops any message that waits longer than ``DROP_WAIT_US`` for room
in the transmit queue: a raw observation needs ~150 ms of a 100 Mbit/s link, so DROP lost every
one of them, silently (issue 10). BLOCK waits as long as its transfer takes; the client puts
from its own sender thread, so the wait never reaches the event loop, and the robot's control
loop runs in its own process anyway. A link that stays stalled is closed by Zenoh after
``block/wait_before_close`` and the client learns it from the lost match at once. Action chunks: RELIABLE per hop,
DROP (never BLOCK: one dead robot uplink must not stall the server's publish path), express,
high priority. A lost chunk is survivable: the edge's queue rides through it, and the edge
asks again once the answer is a few round trips overdue (`RemoteSession.resend`).
"""

from __future__ import annotations

import zenoh


def declare_obs_publisher(zsession: zenoh.Session, key: str) -> zenoh.Publisher:
    """Publisher for one client's observations."""
    return zsession.declare_publisher(
        key,
        congestion_control=zenoh.CongestionControl.BLOCK,
        priority=zenoh.Priority.DATA,
        express=False,
        reliability=zenoh.Reliability.RELIABLE,
    )


def declare_action_publisher(zsession: zenoh.Session, key: str) -> zenoh.Publisher:
    """Publisher for one session's chunks, errors and drain notices."""
    return zsession.declare_publisher(
        key,
        congestion_control=zenoh.CongestionControl.DROP,
        priority=zenoh.Priority.INTERACTIVE_HIGH,
        express=True,
        reliability=zenoh.Reliability.RELIABLE,
    )
