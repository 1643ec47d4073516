"""The QoS table of the protocol (seeds/001 §6.3), in one place.

Observations: congestion DROP, normal priority: the client already keeps only the newest
observation, and a stalled uplink must never stall the robot. Action chunks: RELIABLE per hop,
DROP (never BLOCK: one dead robot uplink must not stall the server's publish path), express,
high priority. A lost chunk is survivable: the edge's queue rides through it.
"""

from __future__ import annotations

import zenoh


def declare_obs_publisher(session: zenoh.Session, key: str) -> zenoh.Publisher:
    """Publisher for one client's observations."""
    return session.declare_publisher(
        key,
        congestion_control=zenoh.CongestionControl.DROP,
        priority=zenoh.Priority.DATA,
        express=False,
        reliability=zenoh.Reliability.RELIABLE,
    )


def declare_action_publisher(session: zenoh.Session, key: str) -> zenoh.Publisher:
    """Publisher for one session's chunks, errors and drain notices."""
    return session.declare_publisher(
        key,
        congestion_control=zenoh.CongestionControl.DROP,
        priority=zenoh.Priority.INTERACTIVE_HIGH,
        express=True,
        reliability=zenoh.Reliability.RELIABLE,
    )
