"""``make gpu-check``: the serving path on this machine's GPU, measured in one command, one table.

Run on a CUDA machine where servo is installed (``pip install -e '.[server,dev]'``): nothing is
downloaded and nothing but 127.0.0.1 is used. For each configuration of the built-in reference
policy (two 480x640 cameras):

* **bare forward**: `InferenceRunner.infer` in a loop in this process, host frames in, chunk out
  (the policy's own device copies included): what a loop around the model alone reaches;
* **served**: the same policy behind ``servo-serve``'s server in its own process, driven by N =
  1, 4 and 16 client processes over Zenoh TCP on 127.0.0.1 (``shared_memory = false``), JPEG
  q90 frames, one request in flight each: chunks/s received, round trip p50 / p99
  (observation stamp -> chunk received, client encode included), server-reported forward time;
* **paths**: which GPU paths the server reported in use (frames decoded on the device = nvJPEG
  on CUDA, pinned host buffers, dtype, CUDA graphs).

``served / bare`` at N = 16 is the share of the bare forward rate the server delivers.

Bounded: every phase prints when it starts; a watchdog ends the whole run (this process and
every child) after ``--budget-s`` (default 230 s) so it can never hang. Without CUDA it runs on
the CPU and says so (``--smoke``: N = 1 and 2, short windows, for CI).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from typing import Any

import numpy as np

from benches._fleet import CAMERAS, HEIGHT, WIDTH, run_process_fleet
from benches._support import REPO, percentiles_ms, ready_process
from testbed.processes import free_port

#: (label, dtype, cuda_graphs) of each reference-policy configuration measured.
CONFIGS = (("fp32", "float32", False), ("bf16+graphs", "bfloat16", True))
START = time.monotonic()


def say(text: str) -> None:
    """A progress line with the time since the start (stderr, so the table stays clean on stdout)."""
    print(f"[gpu-check {time.monotonic() - START:6.1f} s] {text}", file=sys.stderr, flush=True)


def watchdog(budget_s: float) -> None:
    """End this process group after ``budget_s``: no phase may hang the check."""

    def fire() -> None:
        say(f"gave up: still running after {budget_s:g} s (every child process is killed)")
        os.killpg(0, signal.SIGKILL)

    timer = threading.Timer(budget_s, fire)
    timer.daemon = True
    timer.start()


def bare_forward(device: str, dtype: str, graphs: bool, seconds: float) -> dict[str, float]:
    """Forwards/s and ms per forward of `InferenceRunner.infer` on host frames, after a warm-up."""
    import torch

    from servo.policy.reference import ReferencePolicy
    from servo.policy.runner import InferenceRunner, synthetic_observation

    policy = ReferencePolicy(device=device, cameras={name: (HEIGHT, WIDTH) for name in CAMERAS})
    runner = InferenceRunner(policy, device=device, dtype=dtype, cuda_graphs=graphs)  # type: ignore[arg-type]
    processor = policy.make_processor()
    obs = synthetic_observation(policy)
    rng = np.random.default_rng(0)
    obs.images = {name: rng.integers(0, 255, (HEIGHT, WIDTH, 3), dtype=np.uint8) for name in CAMERAS}
    runner.warmup(3)
    times = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter_ns()
        runner.infer(processor, obs, 0)
        times.append((time.perf_counter_ns() - t0) / 1e6)
    del runner, policy, processor
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    (p50,) = percentiles_ms(times, (0.5,))
    return {"per_s": len(times) / seconds, "ms_p50": p50}


def served(device: str, dtype: str, graphs: bool, clients: tuple[int, ...], warmup_s: float, measure_s: float) -> Any:
    """The reference policy served in its own process; yields (paths, {N: stats})."""
    port = free_port()
    options = f"cameras = {{{', '.join(f'{n} = [{HEIGHT}, {WIDTH}]' for n in CAMERAS)}}}"
    command = [sys.executable, "-m", "benches._fleet", "serve", "--port", str(port), "--transport", "tcp"]
    command += ["--source", "reference", "--options", options, "--device", device, "--dtype", dtype]
    command += ["--cuda-graphs"] if graphs else []
    out: dict[int, dict[str, Any]] = {}
    with ready_process(command, "gpu-check server") as (_, words):
        paths = json.loads(words[1]) if len(words) > 1 else {}
        say(f"server up, paths {paths}")
        for n in clients:
            say(f"  N = {n}: {n} client process(es), {warmup_s:g} s warm-up, {measure_s:g} s window")
            result = run_process_fleet(
                port, n, quality=90, warmup_s=warmup_s, measure_s=measure_s, deadline_s=warmup_s + measure_s + 60
            )
            s = result.samples
            r50, r99 = percentiles_ms([x.rtt_ms for x in s], (0.5, 0.99))
            i50, q50 = (
                percentiles_ms([getattr(x, f) for x in s], (0.5,))[0] for f in ("inference_ms", "queue_wait_ms")
            )
            ok = bool(s) and not result.errors  # every request answered (chunk shapes: checked by the client)
            out[n] = {
                "per_s": len(s) / measure_s,
                "rtt_p50": r50,
                "rtt_p99": r99,
                "inf_p50": i50,
                "qw_p50": q50,
                "ok": ok,
            }
    return paths, out


def table(rows: list[dict[str, Any]], clients: tuple[int, ...]) -> str:
    """One markdown table: a row per configuration."""
    head = ["policy", "bare forward /s (ms)"]
    head += [f"N={n}: chunks/s, RTT p50/p99 ms" for n in clients]
    head += [f"served/bare @N={clients[-1]}", "server forward ms @N=1", "paths", "ok"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["policy"], f"{r['bare']['per_s']:.0f} ({r['bare']['ms_p50']:.2f})"]
        for n in clients:
            s = r["served"][n]
            cells.append(f"{s['per_s']:.1f}, {s['rtt_p50']:.1f}/{s['rtt_p99']:.1f}")
        last = r["served"][clients[-1]]["per_s"]
        cells += [f"{last / r['bare']['per_s']:.2f}", f"{r['served'][clients[0]]['inf_p50']:.2f}"]
        cells += [" ".join(f"{k}={v}" for k, v in r["paths"].items()), str(all(s["ok"] for s in r["served"].values()))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benches.gpu_check", description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="N = 1, 2 and short windows (CI, no GPU needed)")
    parser.add_argument("--budget-s", type=float, default=230.0, help="end everything after this long")
    args = parser.parse_args(argv)
    os.setpgrp()  # the watchdog ends this group: this process and every child
    watchdog(args.budget_s)
    import torch

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    clients = (1, 2) if args.smoke else (1, 4, 16)
    warmup_s, measure_s, bare_s = (0.5, 1.0, 0.5) if args.smoke else (1.5, 4.0, 3.0)
    gpu = torch.cuda.get_device_name(0) if cuda else "none (CPU run: the CUDA paths are off)"
    say(f"torch {torch.__version__}, device {device}, GPU {gpu}, repo {REPO}")
    rows = []
    failed = []
    for label, dtype, graphs in CONFIGS[:1] if args.smoke else CONFIGS:
        try:
            say(f"reference {label}: bare forward ({bare_s:g} s)")
            bare = bare_forward(device, dtype, graphs, bare_s)
            say(f"reference {label}: {bare['per_s']:.0f} forwards/s bare; serving it")
            paths, stats = served(device, dtype, graphs, clients, warmup_s, measure_s)
        except Exception as exc:  # one configuration's failure must not hide the others' figures
            say(f"reference {label} FAILED: {type(exc).__name__}: {exc}")
            failed.append(f"reference {label}: {type(exc).__name__}: {exc}")
            continue
        rows.append({"policy": f"reference {label}", "bare": bare, "served": stats, "paths": paths})
    try:
        import lerobot  # noqa: F401
    except ImportError:
        say("LeRobot is not importable here: its row is skipped (Python >= 3.12 and servo-robotics[lerobot])")
    else:
        say("LeRobot is importable, but this check serves the reference policy only (see its docstring)")
    print(table(rows, clients), flush=True)
    for line in failed:
        print(f"FAILED {line}", flush=True)
    print(
        f"\n{gpu}; Zenoh TCP on 127.0.0.1 (shared_memory = false), server and every client in its own process, "
        f"JPEG q90 2x{HEIGHT}x{WIDTH}; {measure_s:g} s windows after {warmup_s:g} s; RTT = observation stamp -> "
        "chunk received; bare forward = InferenceRunner.infer on host frames in this process.",
        flush=True,
    )
    say("done")
    return 0 if rows and not failed and all(all(s["ok"] for s in r["served"].values()) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
