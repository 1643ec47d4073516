"""The servo router: a Zenoh router opened from Python whose access control comes from a fleet file."""

from servo.router.acl import access_control
from servo.router.fleet import Fleet, load_fleet, parse_fleet
from servo.router.service import RouterReady, RouterStartError, router_config, run_router

__all__ = [
    "Fleet",
    "RouterReady",
    "RouterStartError",
    "access_control",
    "load_fleet",
    "parse_fleet",
    "router_config",
    "run_router",
]
