"""Which replicas an edge may use, and what each must share with the first (docs/design/serving.md §4)."""

from __future__ import annotations

from servo.client import ServerInfo
from servo.edge.config import ServerConfig
from servo.wire import PolicyInfo

#: What every replica an edge uses must share with the first one: a difference is DEAD. The revision
#: has its own rules (`ReplicaRules.acceptable`: pinned, or changed at an episode boundary only).
SAME_MODEL_FIELDS = ("model", "chunk_size", "features")


def model_differences(was: PolicyInfo, now: PolicyInfo) -> list[str]:
    """Every field of `SAME_MODEL_FIELDS` that differs, as ``field now (was …)``; empty when the same."""
    differences = []
    for name in SAME_MODEL_FIELDS:
        old, new = getattr(was, name), getattr(now, name)
        if name == "features":
            differences += [
                f"features.{field} {getattr(new, field)!r} (was {getattr(old, field)!r})"
                for field in old.__struct_fields__
                if getattr(old, field) != getattr(new, field)
            ]
        elif old != new:
            differences.append(f"{name} {new!r} (was {old!r})")
    return differences


class ReplicaRules:
    """The replica and revision rules of one edge (its ``[server]`` ``replica`` and ``revision``).

    Owned by the remote engine's event loop. ``identity`` is the policy of the first replica
    used: every later one is held to it.
    """

    def __init__(self) -> None:
        self.identity: PolicyInfo | None = None

    def acceptable(
        self, cfg: ServerConfig, server: ServerInfo, revision: str | None = None, *, episode_starting: bool
    ) -> bool:
        """Whether an edge of ``[server]`` ``cfg`` may use ``server`` now (``revision``: its ack's, else its status's).

        A replica named by ``replica`` only; a pinned ``revision`` only; unpinned, another revision
        than the one in use only at an episode boundary.
        """
        revision = server.status.policy.revision if revision is None else revision
        if cfg.replica and server.keys.replica != cfg.replica:
            return False
        if cfg.revision:
            return revision == cfg.revision
        identity = self.identity
        return identity is None or episode_starting or revision == identity.revision

    def refusal(
        self, cfg: ServerConfig, server: ServerInfo, policy: PolicyInfo, *, episode_starting: bool
    ) -> tuple[str, bool] | None:
        """Why the edge may not use the session ``server`` acked with ``policy``: (reason, fatal), or None.

        Another revision than allowed is refused (a replica mid-upgrade: try another); another
        model, chunk size or features is fatal (DEAD), the reason naming every field.
        """
        if not self.acceptable(cfg, server, policy.revision, episode_starting=episode_starting):
            return f"replica {server.keys.replica} serves revision {policy.revision}", False
        if self.identity is not None and (differences := model_differences(self.identity, policy)):
            return f"server came back with a different model: {'; '.join(differences)}", True
        return None
