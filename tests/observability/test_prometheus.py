"""examples/observability against the real tools: promtool checks and unit-tests the alert rules, and
a real Prometheus scraping a running fleet (two replicas, simulated robots, servo-monitor) answers
every query of the Grafana dashboard with data."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.edge.harness import Proc
from tests.guides import guide, section
from tests.observability.browser import tool
from tests.observability.fleet import running_fleet
from tests.support import free_port

pytestmark = [pytest.mark.observability, pytest.mark.timeout(300)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "observability"
DASHBOARD = EXAMPLES / "grafana" / "servo-fleet.json"
#: What Grafana substitutes in the dashboard's queries (every robot; a rate window of a few scrapes).
VARIABLES = {"$robot": ".*", "$__rate_interval": "15s", "$__interval": "5s"}


def promtool(*args: str) -> str:
    done = subprocess.run([tool("promtool"), *args], cwd=EXAMPLES, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_the_alert_rules_and_the_scrape_config_pass_promtool() -> None:
    assert "SUCCESS: 7 rules found" in promtool("check", "rules", "alerts.yml")
    assert "SUCCESS" in promtool("check", "config", "prometheus.yml")
    assert "SUCCESS" in promtool("test", "rules", "alerts_test.yml")


def dashboard_queries() -> list[tuple[str, str]]:
    """``(panel title, query)`` of every target of every panel, variables substituted."""
    dashboard = json.loads(DASHBOARD.read_text())
    queries = []
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for name, value in VARIABLES.items():
                expr = expr.replace(name, value)
            assert "$" not in expr, f"{panel['title']}: unknown variable in {expr}"
            queries.append((panel["title"], expr))
    return queries


def runbook_queries(robot: str) -> list[str]:
    """The operations runbook's PromQL (docs/guides/operations.md), for ``robot`` in place of its robot-217."""
    text = section(guide("operations"), 'The runbook: "robot 217 stuttered at 14:03"')
    (block,) = re.findall(r"```promql\n(.*?)```", text, re.DOTALL)
    return [line.strip().replace("robot-217", robot) for line in block.splitlines() if line.strip()]


def test_the_dashboard_is_valid_grafana_json() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "robot"}
    assert len(dashboard_queries()) >= len(ids)


class Prometheus:
    """A real Prometheus (Debian's) scraping the given targets every second, in its own process."""

    def __init__(self, workdir: Path, replicas: list[int], monitor: int) -> None:
        self.port = free_port()
        config = workdir / "prometheus.yml"
        config.write_text(
            f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
rule_files: ["{EXAMPLES / "alerts.yml"}"]
scrape_configs:
  - job_name: servo-replicas
    static_configs: [{{targets: {[f"127.0.0.1:{p}" for p in replicas]}}}]
  - job_name: servo-monitor
    static_configs: [{{targets: ["127.0.0.1:{monitor}"]}}]
"""
        )
        self.proc = Proc(
            [
                tool("prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ]
        )

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def eventually(self, what: str, check: Any, timeout: float = 60) -> Any:
        """Poll ``check()`` until it returns something truthy (Prometheus scrapes every second)."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = check()
            except OSError as exc:  # not listening yet
                last = exc
            if last and not isinstance(last, Exception):
                return last
            time.sleep(0.5)
        raise AssertionError(
            f"{what}: nothing after {timeout} s (last: {last!r}); prometheus said:\n{self.proc.output[-3000:]}"
        )


def test_every_dashboard_query_returns_data_from_a_real_prometheus(tmp_path: Path) -> None:
    with running_fleet(tmp_path, replicas=2, robots=2) as fleet:
        prometheus = Prometheus(tmp_path, list(fleet.health_ports.values()), fleet.monitor_port)
        try:
            prometheus.eventually(
                "every target up",
                lambda: [r["value"][1] for r in prometheus.api("query", query="up")["result"]] == ["1"] * 3,
            )
            # Every alert rule loads and evaluates against the real series ("unknown" until its first run).
            health = prometheus.eventually(
                "alert rules evaluated",
                lambda: (
                    (h := {r["name"]: r["health"] for g in prometheus.api("rules")["groups"] for r in g["rules"]})
                    and "unknown" not in h.values()
                    and h
                ),
            )
            assert len(health) == 7
            assert set(health.values()) == {"ok"}, health
            robots = prometheus.eventually(
                "the dashboard's robot variable",
                lambda: prometheus.api("label/robot/values", **{"match[]": "servo_edge_up"}),
            )
            assert set(robots) == {"robot-0", "robot-1"}
            queries = [*dashboard_queries(), *(("the runbook", q) for q in runbook_queries("robot-0"))]
            assert len(queries) > len(dashboard_queries()) + 3
            for title, query in queries:
                result = prometheus.eventually(
                    f"{title}: {query}", lambda q=query: prometheus.api("query", query=q)["result"]
                )
                assert all(re.fullmatch(r"-?[0-9.e+-]+|NaN", sample["value"][1]) for sample in result), (title, result)
        finally:
            prometheus.proc.stop()
