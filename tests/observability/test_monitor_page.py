"""servo-monitor's page in headless Chromium, over a real fleet: two replicas, three simulated robots.

The page loads, lists every replica and robot with live data, opens a robot's timeline (its
transitions from telemetry, its requests from the replicas' audit) and follows the fleet when a
replica is killed. The screenshot is kept in ``artifacts/monitor.png``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.observability.browser import ARTIFACTS, chromium, wait_until
from tests.observability.fleet import running_fleet

pytestmark = [pytest.mark.observability, pytest.mark.timeout(300)]

#: The robots table's "replica" column.
REPLICA_COLUMN = 8


def rows(driver: Any, table: str, attribute: str) -> dict[str, str]:
    """``{row's name: its status}`` of one table (``data-*`` attributes the page sets).

    Read in one script: the page rebuilds its tables every second, so elements found in one call
    may be gone by the next.
    """
    name = table.rstrip("s")
    script = (
        f"return [...document.querySelectorAll('#{table} tbody tr')]"
        f".map(r => [r.dataset.{name}, r.dataset.{attribute}])"
    )
    return dict(driver.execute_script(script))


def text(driver: Any, css: str) -> str:
    """The text of the element ``css`` selects ("" when there is none), read in one script."""
    return str(
        driver.execute_script("const e = document.querySelector(arguments[0]); return e ? e.textContent : ''", css)
    )


def cell(driver: Any, robot: str, column: int) -> str:
    """One cell of a robot's row (read in one script, like `rows`)."""
    script = (
        "const r = document.querySelector(`#robots tr[data-robot='${arguments[0]}']`);"
        "return r ? r.cells[arguments[1]].textContent : ''"
    )
    return str(driver.execute_script(script, robot, column))


def test_the_page_shows_the_fleet_and_follows_a_replica_kill(tmp_path: Path) -> None:
    with running_fleet(tmp_path, replicas=2, robots=3) as fleet, chromium(1280, 1500) as driver:
        driver.get(fleet.url)
        assert driver.title == "servo fleet"
        robots = {f"robot-{i}" for i in range(3)}
        wait_until(
            driver,
            lambda d: rows(d, "robots", "state") == dict.fromkeys(robots, "streaming"),
            90,
            "three streaming robots",
        )
        assert rows(driver, "replicas", "status") == {"replica-0": "serving", "replica-1": "serving"}
        assert "replicas 2/2 up" in text(driver, "#replica-count")
        assert driver.execute_script("return document.querySelectorAll('#histogram rect').length") > 0

        # One click to a robot's timeline: its transitions and its requests as the replicas audited them.
        driver.execute_script("document.querySelector(`#robots tr[data-robot='robot-0']`).click()")
        wait_until(driver, lambda d: text(d, "#requests tbody") != "", 30, "requests")
        transitions = text(driver, "#transitions")
        assert "streaming" in transitions
        assert "chunk merged" in transitions
        assert "ok" in text(driver, "#requests tbody")

        victim = cell(driver, "robot-0", REPLICA_COLUMN)
        fleet.replicas[victim].kill()
        survivor = next(name for name in fleet.replicas if name != victim)
        wait_until(driver, lambda d: rows(d, "replicas", "status").get(victim) == "down", 30, f"{victim} down")
        assert "replicas 1/2 up" in text(driver, "#replica-count")
        # Its robots fail over: every robot streams again, from the survivor.
        wait_until(
            driver,
            lambda d: (
                rows(d, "robots", "state") == dict.fromkeys(robots, "streaming")
                and all(cell(d, robot, REPLICA_COLUMN) == survivor for robot in robots)
            ),
            60,
            f"every robot streaming from {survivor}",
        )
        wait_until(driver, lambda d: survivor in text(d, "#timeline-note"), 30, "the timeline following")
        events = text(driver, "#events")
        assert f"{victim}: down" in events
        ARTIFACTS.mkdir(exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "monitor.png"))
