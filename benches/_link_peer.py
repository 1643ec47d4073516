"""The far end of `bench_policy_link.py`: answers each observation with a 50x6 chunk, as a policy
process with an instant policy would (``python -m benches._link_peer FD SOCKET_BUFFER_BYTES``)."""

from __future__ import annotations

import socket
import sys

import numpy as np

from servo.policy.channel import Body, Channel, ChannelClosed, Chunk, Infer, Outcomes


def main() -> None:
    fd, buffer_bytes = int(sys.argv[1]), int(sys.argv[2])
    sock = socket.socket(fileno=fd)
    channel = Channel(sock, arena="reads")
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):  # as a kernel with lower limits grants
        sock.setsockopt(socket.SOL_SOCKET, option, buffer_bytes)
    chunk = np.ones((50, 6), np.float32)
    try:
        while True:
            message, arrays = channel.receive()
            assert isinstance(message, Infer)
            for request in message.requests:
                arrays.observation(request)
            body = Body()
            channel.send(Outcomes([Chunk(body.add(chunk), body.add(chunk)) for _ in message.requests]), body)
    except ChannelClosed:
        channel.close()


if __name__ == "__main__":
    main()
