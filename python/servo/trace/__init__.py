"""``servo-trace``: one robot's timeline from its recordings and the replicas' audit logs (docs/design/audit.md)."""

from servo.trace.render import plot, table
from servo.trace.timeline import Request, Timeline, TraceError, build, parse_time, read_audit

__all__ = ["Request", "Timeline", "TraceError", "build", "parse_time", "plot", "read_audit", "table"]
