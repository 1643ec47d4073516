"""pytest-benchmark settings shared by every bench file."""

from __future__ import annotations

from typing import Any


def pytest_benchmark_update_json(config: Any, benchmarks: Any, output_json: dict[str, Any]) -> None:
    """Keep summaries only: pytest-benchmark would store every raw sample (~500k lines per run).

    The percentiles a latency benchmark reports live in its ``extra_info``; min/median/quartiles
    stay in ``stats``.
    """
    for bench in output_json["benchmarks"]:
        bench["stats"].pop("data", None)
