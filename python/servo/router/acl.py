"""Zenoh ``access_control`` generated from a fleet: default deny, one policy per role.

How zenoh 1.10 applies a rule (``zenoh/src/net/routing/interceptor``, verified by tests/router):

- The router checks every message on every link, per *flow*: ``ingress`` is what a member sends
  to the router, ``egress`` what the router sends to it. A message passes only when a rule of the
  member's subject, for that flow and message type, has a key expression that *includes* the
  message's key. A declaration on a wider key (a subscriber on ``@servo/**``) is therefore denied.
- Message types: ``put``, ``delete``, ``declare_subscriber``, ``query``, ``declare_queryable``,
  ``reply``, ``liveliness_token``, ``declare_liveliness_subscriber``, ``liveliness_query``.
- A member sees a subscriber through egress ``declare_subscriber`` *on the subscriber's own key*:
  a robot's observation publisher only sends once it has seen the server's ``…/c/*/obs``
  subscriber, so robots need that wildcard in egress (it reveals nothing but the server).
- Denied messages vanish silently: a wrong rule shows up only as something that never arrives.

Key layout (`servo.wire.keys`), ``A`` = ``@servo/*/*/*`` (any app, model, replica), ``R`` = the
robot's name, which is its client id:

- robot: sends puts on ``A/c/R/obs``, subscribes to ``A/c/R/action``, queries
  ``A/status|trajectory`` and its own ``A/c/R/session`` and ``A/c/R/control``, declares the token
  ``A/c/R/alive``, watches and queries server tokens ``A/alive``; receives its own chunks, the
  replies, server tokens and the servers' ``A/c/*/obs`` subscriber declarations. Session open
  being on the robot's own key is what stops robot-8 from opening (or replacing) a session
  under robot-7's name: the server takes the client id from the key it was queried on.
- server (keys ``P``): declares and answers the ``P/status|trajectory``, ``P/c/*/session`` and
  ``P/c/*/control`` queryables, subscribes to ``P/c/*/obs``, puts on ``P/c/*/action``, declares
  ``P/alive``, watches robot tokens ``P/c/*/alive``; receives those queries, observations and
  tokens, and robots' action subscriber declarations.
- monitor: queries ``A/status`` and ``A/audit`` (a replica's recent requests), watches and
  queries every token, subscribes to every robot's telemetry ``T/*/telemetry``; with ``data``
  also subscribes to ``A/c/*/obs`` and ``A/c/*/action``. It never puts, answers or declares a
  token.
- telemetry (``T`` = ``@servo/@robots``, `servo.wire.telemetry`): robot R alone puts on
  ``T/R/telemetry``, and sees monitors' ``T/*/telemetry`` subscriber declarations (its publisher
  sends only once it knows one); nobody else may put there.
- router (mesh): everything under ``@servo/**`` and ``T/**`` both ways (``**`` never crosses
  the verbatim ``@robots`` chunk); each router polices its own members.

``P`` is ``@servo/<app>/<model>/*`` for each app and model a server group is limited to. A
server's discovery queries come in on ``@servo/*/*/*/status`` (the robot's wildcard), so that
egress rule is never narrowed.
"""

from __future__ import annotations

from typing import Any, Literal

from servo.router.fleet import Fleet, ServerGroup
from servo.wire import ROOT
from servo.wire.telemetry import ROBOTS_CHUNK, TELEMETRY_SELECTOR, telemetry_key

Flow = Literal["ingress", "egress"]

#: Any replica of any model of any app.
ANY = f"{ROOT}/*/*/*"
ALL_MESSAGES = (
    "put",
    "delete",
    "declare_subscriber",
    "query",
    "declare_queryable",
    "reply",
    "liveliness_token",
    "declare_liveliness_subscriber",
    "liveliness_query",
)
_SERVER_QUERIES = ("status", "trajectory")
#: What a server answers for monitors only.
_MONITOR_QUERIES = ("status", "audit")
#: What a server answers for each client, under ``c/<client>/``.
_CLIENT_QUERIES = ("session", "control")


def access_control(fleet: Fleet) -> dict[str, Any]:
    """The ``access_control`` section of the router's Zenoh config for ``fleet``."""
    acl = _Builder(fleet.identified_by)
    if fleet.robots:
        acl.policy("robots", [name for group in fleet.robots for name in group.names], _shared_robot_rules())
    for group in fleet.robots:
        for name in group.names:
            acl.policy(f"robot:{name}", [name], _robot_rules(name))
    for i, server in enumerate(fleet.servers):
        acl.policy(f"servers[{i}]", server.names, _server_rules(server))
    for i, monitor in enumerate(fleet.monitors):
        acl.policy(f"monitors[{i}]", monitor.names, _monitor_rules(data=monitor.data))
    for i, routers in enumerate(fleet.routers):
        keys = [f"{ROOT}/**", f"{ROOT}/{ROBOTS_CHUNK}/**"]
        acl.policy(f"routers[{i}]", routers.names, [("ingress", ALL_MESSAGES, keys), ("egress", ALL_MESSAGES, keys)])
    return acl.section()


RuleSpec = tuple[Flow, tuple[str, ...], list[str]]


def _shared_robot_rules() -> list[RuleSpec]:
    queries = [f"{ANY}/{leaf}" for leaf in _SERVER_QUERIES]
    return [
        ("ingress", ("query",), queries),
        ("egress", ("reply",), queries),
        ("ingress", ("declare_liveliness_subscriber", "liveliness_query"), [f"{ANY}/alive"]),
        ("egress", ("liveliness_token",), [f"{ANY}/alive"]),
        ("egress", ("declare_subscriber",), [f"{ANY}/c/*/obs", TELEMETRY_SELECTOR]),
    ]


def _robot_rules(name: str) -> list[RuleSpec]:
    own = f"{ANY}/c/{name}"
    return [
        ("ingress", ("put",), [f"{own}/obs"]),
        ("ingress", ("declare_subscriber",), [f"{own}/action"]),
        ("egress", ("put",), [f"{own}/action"]),
        ("ingress", ("query",), [f"{own}/{leaf}" for leaf in _CLIENT_QUERIES]),
        ("egress", ("reply",), [f"{own}/{leaf}" for leaf in _CLIENT_QUERIES]),
        ("ingress", ("liveliness_token",), [f"{own}/alive"]),
        ("ingress", ("put",), [telemetry_key(name)]),
    ]


def _server_rules(group: ServerGroup) -> list[RuleSpec]:
    prefixes = [f"{ROOT}/{app}/{model}/*" for app in group.apps for model in group.models]

    def under(*leaves: str) -> list[str]:
        return [f"{p}/{leaf}" for p in prefixes for leaf in leaves]

    served = under(*_SERVER_QUERIES, "audit", *(f"c/*/{leaf}" for leaf in _CLIENT_QUERIES))
    return [
        ("ingress", ("declare_queryable", "reply"), served),
        ("egress", ("query",), [*served, f"{ANY}/status", f"{ANY}/audit"]),
        ("ingress", ("declare_subscriber",), under("c/*/obs")),
        ("egress", ("put",), under("c/*/obs")),
        ("ingress", ("put",), under("c/*/action")),
        ("egress", ("declare_subscriber",), under("c/*/action")),
        ("ingress", ("liveliness_token",), under("alive")),
        ("ingress", ("declare_liveliness_subscriber", "liveliness_query"), under("c/*/alive")),
        ("egress", ("liveliness_token",), under("c/*/alive")),
    ]


def _monitor_rules(*, data: bool) -> list[RuleSpec]:
    tokens = [f"{ANY}/alive", f"{ANY}/c/*/alive"]
    queries = [f"{ANY}/{leaf}" for leaf in _MONITOR_QUERIES]
    rules: list[RuleSpec] = [
        ("ingress", ("query",), queries),
        ("egress", ("reply",), queries),
        ("ingress", ("declare_liveliness_subscriber", "liveliness_query"), tokens),
        ("egress", ("liveliness_token",), tokens),
        ("ingress", ("declare_subscriber",), [TELEMETRY_SELECTOR]),
        ("egress", ("put",), [TELEMETRY_SELECTOR]),
    ]
    if data:
        streams = [f"{ANY}/c/*/obs", f"{ANY}/c/*/action"]
        rules += [("ingress", ("declare_subscriber",), streams), ("egress", ("put",), streams)]
    return rules


class _Builder:
    """Accumulates rules, subjects and policies with unique ids; owned by one `access_control` call."""

    def __init__(self, kind: str) -> None:
        self._kind = kind
        self._rules: list[dict[str, Any]] = []
        self._subjects: list[dict[str, Any]] = []
        self._policies: list[dict[str, Any]] = []

    def policy(self, subject_id: str, names: list[str], specs: list[RuleSpec]) -> None:
        rule_ids = []
        for i, (flow, messages, keys) in enumerate(specs):
            rule_id = f"{subject_id}/{i}"
            self._rules.append(
                {
                    "id": rule_id,
                    "permission": "allow",
                    "flows": [flow],
                    "messages": list(messages),
                    "key_exprs": keys,
                }
            )
            rule_ids.append(rule_id)
        self._subjects.append({"id": subject_id, self._kind: list(names)})
        self._policies.append({"id": subject_id, "rules": rule_ids, "subjects": [subject_id]})

    def section(self) -> dict[str, Any]:
        return {
            "enabled": True,
            "default_permission": "deny",
            "rules": self._rules,
            "subjects": self._subjects,
            "policies": self._policies,
        }
