"""Use servo's async client on its own: discover a server, open a session, request chunks.

servo-serve examples/manifest.toml &
.venv/bin/python examples/client_quickstart.py --connect tcp/127.0.0.1:7447
"""

from __future__ import annotations

import argparse

import anyio
import numpy as np

import servo


async def main(connect: str, requests: int) -> None:
    settings = servo.ZenohSettings(mode="client", connect=[connect])
    async with servo.PolicyClient.connect(settings, client_id="quickstart") as client:
        servers = await client.discover()
        server = servers[0]
        print(f"found {len(servers)} server(s); using {server.keys.prefix} ({server.status.policy.model})")
        features = server.status.policy.features  # a real robot passes its own features here
        async with client.session(server, features=features, fps=server.status.policy.fps) as session:
            frames = {name: np.zeros((cam.height, cam.width, 3), np.uint8) for name, cam in features.cameras.items()}
            state = np.zeros(len(features.state_names), np.float32)
            for _ in range(requests):
                result = await session.infer(state, frames, timeout=5.0)
                print(
                    f"seq {result.seq_id}: chunk {result.chunk_robot.shape}, round trip {result.rtt_ns / 1e6:.1f} ms "
                    f"(queue {result.queue_wait_ms:.1f} ms, inference {result.inference_ms:.1f} ms)"
                )
                state = result.chunk_robot[-1]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connect", default="tcp/127.0.0.1:7447")
    parser.add_argument("--requests", type=int, default=5)
    args = parser.parse_args()
    anyio.run(main, args.connect, args.requests, backend="asyncio", backend_options={"use_uvloop": True})
