"""What each of N replicas of one manifest runs with.

Replicas share the model, the app and the Zenoh network of the manifest; what must differ is
derived here, deterministically from the replica's index, so a replica restarted by the cluster
engine comes back with the same identity and an edge pinned to it finds it again:

- the replica id, ``<serving.replica or the model source>-<index>`` (the key segment edges see);
- ports: a Zenoh listen endpoint, health port or openpi front door port fixed in the manifest is
  shifted by the index, so replicas placed on one node do not collide (port 0 stays 0);
- the audit log, one file per replica (session ids are per replica, so lines would be ambiguous);
- relative paths (TLS files, trajectories, audit log) become absolute against the deploying
  process's working directory, since replicas do not run where the manifest was read;
- no join token at start (``security.join_token_ttl_s = 0``): nobody would see a replica's;
  ``servo-serve robots token`` makes one for robots to join with.
"""

from __future__ import annotations

import re
from pathlib import Path

from msgspec.structs import replace

from servo.config import ConfigError, quoted
from servo.server.manifest import Manifest
from servo.transport import TlsSettings
from servo.wire import slugify
from servo.wire.keys import MAX_SEGMENT_LEN

#: ``proto/address:port`` followed by optional zenoh metadata (``?…``) or config (``#…``).
_ENDPOINT_PORT = re.compile(r"^(?P<head>[^/]+/.*:)(?P<port>\d+)(?P<tail>[?#].*)?$")
_INDEX_ROOM = 8  # characters kept free in a replica id for "-<index>"


def replica_base(manifest: Manifest) -> str:
    """The replica id stem: ``serving.replica`` if set, else a slug of ``model.source``."""
    base = manifest.serving.replica or slugify(manifest.model.source, what="model.source")
    return base[: MAX_SEGMENT_LEN - _INDEX_ROOM]


def replica_manifests(manifest: Manifest, replicas: int, *, cwd: Path, origin: str = "manifest") -> list[Manifest]:
    """The manifest of each replica, index 0 to ``replicas - 1``.

    Args:
        manifest: The validated manifest.
        replicas: How many.
        cwd: The directory relative paths of the manifest are relative to.
        origin: The manifest's file, named in errors.

    Raises:
        ConfigError: the manifest cannot be shared by that many replicas (the key named).
    """
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    if re.fullmatch(r"cuda:\d+", manifest.model.device):
        raise _refused(
            origin,
            "model.device",
            manifest.model.device,
            "names one GPU; each replica gets its own GPU from the cluster and sees it as 'cuda' (use \"cuda\")",
        )
    shared = _absolute_paths(manifest, cwd)
    base = replica_base(manifest)
    return [_replica(shared, f"{base}-{index}", index, replicas, origin) for index in range(replicas)]


def _replica(manifest: Manifest, replica_id: str, index: int, replicas: int, origin: str) -> Manifest:
    zenoh, ops, frontends = manifest.zenoh, manifest.ops, manifest.frontends
    if replicas > 1:
        listen = [_shifted(endpoint, index, replicas, origin) for endpoint in zenoh.listen]
        zenoh = replace(zenoh, listen=listen)
        if ops.health_port:
            ops = replace(ops, health_port=_port(ops.health_port, index, replicas, origin, "ops.health_port"))
        openpi = frontends.openpi
        if openpi is not None and openpi.port:
            host = openpi.listen.rpartition(":")[0]
            port = _port(openpi.port, index, replicas, origin, "frontends.openpi.listen")
            frontends = replace(frontends, openpi=replace(openpi, listen=f"{host}:{port}"))
        if ops.audit_log and ops.audit_log != "-":
            audit = Path(ops.audit_log)
            ops = replace(ops, audit_log=str(audit.with_name(f"{audit.stem}.{replica_id}{audit.suffix}")))
    serving = replace(manifest.serving, replica=replica_id)
    security = replace(manifest.security, join_token_ttl_s=0.0)
    return replace(manifest, serving=serving, zenoh=zenoh, ops=ops, frontends=frontends, security=security)


def _shifted(endpoint: str, index: int, replicas: int, origin: str) -> str:
    match = _ENDPOINT_PORT.match(endpoint)
    if match is None:
        raise _refused(origin, "zenoh.listen", endpoint, f"has no port to give each of {replicas} replicas its own")
    port = int(match["port"])
    if port == 0:
        return endpoint
    return f"{match['head']}{_port(port, index, replicas, origin, 'zenoh.listen')}{match['tail'] or ''}"


def _port(port: int, index: int, replicas: int, origin: str, key: str) -> int:
    if port + replicas - 1 > 65535:
        raise _refused(origin, key, port, f"leaves no room for {replicas} consecutive ports below 65536")
    return port + index


def _refused(origin: str, key: str, value: object, problem: str) -> ConfigError:
    return ConfigError(f"{origin}: {key} = {quoted(value)}: {problem}")


def _absolute_paths(manifest: Manifest, cwd: Path) -> Manifest:
    def absolute(path: str) -> str:
        return str(cwd / path)  # an absolute `path` stays as it is

    tls = manifest.zenoh.tls
    if tls is not None:
        files = {
            name: absolute(value)
            for name in TlsSettings.__struct_fields__
            if isinstance(value := getattr(tls, name), str)
        }
        manifest = replace(manifest, zenoh=replace(manifest.zenoh, tls=replace(tls, **files)))
    trajectories = [replace(t, path=absolute(t.path)) for t in manifest.trajectories]
    audit = manifest.ops.audit_log
    ops = replace(manifest.ops, audit_log=absolute(audit)) if audit and audit != "-" else manifest.ops
    return replace(manifest, trajectories=trajectories, ops=ops)
