"""pytest-benchmark settings shared by every bench file."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pytest_configure(config: Any) -> None:
    """Create the folder ``--benchmark-json`` writes to (``benches/results/raw/`` is not in git):
    a long run must not end in FileNotFoundError."""
    target = getattr(config.option, "benchmark_json", None)
    if target is not None:
        Path(target).parent.mkdir(parents=True, exist_ok=True)


def pytest_benchmark_update_json(config: Any, benchmarks: Any, output_json: dict[str, Any]) -> None:
    """Keep summaries only: pytest-benchmark would store every raw sample (~500k lines per run).

    The percentiles a latency benchmark reports live in its ``extra_info``; min/median/quartiles
    stay in ``stats``.
    """
    for bench in output_json["benchmarks"]:
        bench["stats"].pop("data", None)
