"""servo-monitor's page in headless Chromium, over a real fleet: two replicas, three simulated robots.

The page loads, lists every replica and robot with live data, opens a robot's timeline (its
transitions from telemetry, its requests from the replicas' audit) and follows the fleet when a
replica is killed. The screenshot is kept in ``artifacts/monitor.png``.
"""

from __future__ import annotations

import signal
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.observability.browser import ARTIFACTS, chromium, wait_until
from tests.observability.fleet import running_fleet

pytestmark = [pytest.mark.observability, pytest.mark.timeout(300)]

#: The robots table's "replica" column.
REPLICA_COLUMN = 8
#: What the page shows where there is no figure (an en dash).
NONE = "\u2013"


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
        wait_until(driver, lambda d: rows(d, "robots", "state") == dict.fromkeys(robots, "streaming"), 90, "streaming")
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
        # A down replica shows what it served, none of its last live figures.
        sessions = driver.execute_script(
            "return [...document.querySelector(`#replicas tr[data-replica='${arguments[0]}']`).cells]"
            ".map(c => c.textContent)",
            victim,
        )
        assert (sessions[4], sessions[5], sessions[6]) == (NONE,) * 3, sessions
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
        # A robot that streamed, failed over and streams again: one event, counted twice.
        merged = driver.execute_script(
            "return [...document.querySelectorAll('#events li')].filter(li => li.textContent.includes("
            "'robot-0: streaming: chunk merged')).map(li => Number(li.dataset.count))"
        )
        assert len(merged) == 1, merged
        assert merged[0] >= 2, merged
        ARTIFACTS.mkdir(exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "monitor.png"))


def test_stopped_crashed_and_stale_robots_a_filter_a_link_and_round_trips_over_time(tmp_path: Path) -> None:
    with running_fleet(tmp_path, replicas=1, robots=3) as fleet, chromium(1280, 1500) as driver:
        # Before its first answer the page says it is loading, not that the fleet is empty.
        page = urllib.request.urlopen(fleet.url, timeout=10).read().decode()
        assert page.count("loading…") == 3
        driver.get(fleet.url)
        robots = {f"robot-{i}" for i in range(3)}
        wait_until(driver, lambda d: rows(d, "robots", "state") == dict.fromkeys(robots, "streaming"), 90, "streaming")
        # The filter narrows the robots (and events) to what it names.
        driver.find_element("id", "filter").send_keys("robot-1")
        wait_until(driver, lambda d: set(rows(d, "robots", "state")) == {"robot-1"}, 10, "robot-1 alone")
        assert text(driver, "#shown") == "1 of 3"
        driver.find_element("id", "filter").clear()
        driver.execute_script("document.getElementById('filter').dispatchEvent(new Event('input'))")
        wait_until(driver, lambda d: set(rows(d, "robots", "state")) == robots, 10, "every robot again")
        # The fleet's round trip over time.
        wait_until(
            driver,
            lambda d: d.execute_script("return document.querySelectorAll('#fleet-rtt .rtt-p50').length") > 0,
            30,
            "the fleet round-trip chart",
        )

        # Ctrl-C on one robot: it says goodbye. kill -9 on another: it goes silent.
        fleet.robots["robot-0"].popen.send_signal(signal.SIGINT)
        fleet.robots["robot-1"].kill()
        wait_until(driver, lambda d: rows(d, "robots", "state").get("robot-0") == "stopped", 60, "robot-0 stopped")
        wait_until(driver, lambda d: rows(d, "robots", "state").get("robot-1") == "stale", 30, "robot-1 stale")
        wait_until(driver, lambda d: rows(d, "robots", "state").get("robot-1") == "crashed", 60, "robot-1 crashed")
        assert rows(driver, "robots", "state")["robot-0"] == "stopped"  # a goodbye never turns stale
        assert rows(driver, "robots", "state")["robot-2"] == "streaming"
        assert "robot-0: stopped: signal" in text(driver, "#events")

        # A robot's own link opens its timeline: it ends crashed, and charts its round trips.
        driver.get(f"{fleet.url}#robot=robot-1")
        wait_until(driver, lambda d: "crashed" in text(d, "#timeline-note"), 30, "robot-1's timeline")
        assert text(driver, "#timeline-robot") == "robot-1"
        bands = driver.execute_script(
            "return [...document.querySelectorAll('#timeline .band')].map(b => b.dataset.state)"
        )
        assert bands[-2:] == ["stale", "crashed"], bands
        assert driver.execute_script("return document.querySelectorAll('#robot-rtt .rtt-p50').length") > 0
        driver.save_screenshot(str(tmp_path / "stopped-and-crashed.png"))
