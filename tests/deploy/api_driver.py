"""A Python program driving `servo.deploy.ray` directly, as a user of the API would.

``python -m tests.deploy.api_driver MANIFEST ADDRESS REPLICAS``: deploys, prints one JSON line per
ready replica, waits for a line on stdin, drains, prints one JSON line per drained replica.
"""

from __future__ import annotations

import sys

import anyio
import msgspec

from servo.deploy.ray import Deployment, deploy
from servo.server.manifest import load_manifest


async def run(deployment: Deployment) -> None:
    for ready in await deployment.wait_ready():
        print(msgspec.json.encode(ready).decode(), flush=True)
    await anyio.to_thread.run_sync(sys.stdin.readline)
    for stopped in await deployment.drain():
        print(msgspec.json.encode(stopped).decode(), flush=True)


def main() -> None:
    manifest, address, replicas = sys.argv[1:]
    deployment = deploy(load_manifest(manifest), manifest_path=manifest, address=address, replicas=int(replicas))
    try:
        anyio.run(run, deployment)
    finally:
        deployment.close()


if __name__ == "__main__":
    main()
