"""Per-robot series as a scrape shows them: Prometheus text, written again only for robots that changed."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from servo.server.robot_metrics import OTHER, RobotMetrics
from tests.server.helpers import sample


def test_every_series_of_a_robot_is_valid_prometheus_text() -> None:
    robots = RobotMetrics(cap=2)
    odd = 'arm "7"\\left'  # a client id is anything a key holds: the label must still parse back
    robots.attach(odd)
    for staleness in (4.0, 10.0, 30.0, 7000.0):
        robots.served(odd, "ok", 2.0, 5.0, staleness, 1)
    robots.served(odd, "stale_observation", 1.0, 0.0, 1.5, 0)
    robots.rejected(odd, "mac")
    robots.rejected("stranger", "header")  # no session here: never a label of its own
    text = robots.exposition()
    families = {f.name: f for f in text_string_to_metric_families(text.decode())}  # raises on a bad line
    assert set(families) == {
        "servo_robot_requests",
        "servo_robot_superseded_observations",
        "servo_robot_observations_rejected",
        "servo_robot_queue_wait_ms",
        "servo_robot_inference_ms",
        "servo_robot_staleness_ms",
    }
    assert sample(text, "servo_robot_requests_total", robot=odd, outcome="ok") == 4
    assert sample(text, "servo_robot_requests_total", robot=odd, outcome="stale_observation") == 1
    assert sample(text, "servo_robot_superseded_observations_total", robot=odd) == 4
    assert sample(text, "servo_robot_observations_rejected_total", robot=odd, reason="mac") == 1
    assert sample(text, "servo_robot_observations_rejected_total", robot=OTHER, reason="header") == 1
    assert sample(text, "servo_robot_queue_wait_ms_count", robot=odd) == 5
    assert sample(text, "servo_robot_queue_wait_ms_sum", robot=odd) == 9.0
    assert sample(text, "servo_robot_inference_ms_sum", robot=odd) == 20.0
    buckets = {s.labels["le"]: s.value for s in families["servo_robot_staleness_ms"].samples if s.labels.get("le")}
    # Cumulative, as Prometheus reads them: 1.5 and 4 <= 5, 10 <= 10, 30 <= 50, 7000 only in +Inf.
    assert [buckets[le] for le in ("5.0", "10.0", "20.0", "50.0", "5000.0", "+Inf")] == [2, 3, 3, 4, 4, 5]
    assert sample(text, "servo_robot_staleness_ms_count", robot=odd) == 5
    assert sample(text, "servo_robot_staleness_ms_sum", robot=odd) == 7045.5


def test_a_scrape_shows_every_change_since_the_last_one() -> None:
    robots = RobotMetrics(cap=4)
    robots.attach("a")
    robots.attach("b")
    robots.served("a", "ok", 1.0, 1.0, 1.0, 0)
    robots.served("b", "ok", 1.0, 1.0, 1.0, 0)
    first = robots.exposition()
    assert robots.exposition() == first  # nothing changed: the same text
    robots.served("a", "ok", 1.0, 1.0, 100.0, 0)
    robots.rejected("b", "rate")
    second = robots.exposition()
    assert sample(second, "servo_robot_requests_total", robot="a", outcome="ok") == 2
    assert sample(second, "servo_robot_staleness_ms_sum", robot="a") == 101.0
    assert sample(second, "servo_robot_observations_rejected_total", robot="b", reason="rate") == 1
    assert sample(second, "servo_robot_requests_total", robot="b", outcome="ok") == 1  # unchanged, still shown
    robots.detach("a")
    third = robots.exposition()
    assert b'robot="a"' not in third
    assert sample(third, "servo_robot_requests_total", robot="b", outcome="ok") == 1
    robots.attach("a")  # a new session: its series start again from 0
    robots.served("a", "ok", 1.0, 1.0, 1.0, 0)
    assert sample(robots.exposition(), "servo_robot_requests_total", robot="a", outcome="ok") == 1


def test_labels_are_capped_and_other_is_never_a_robots_own() -> None:
    robots = RobotMetrics(cap=1)
    robots.attach(OTHER)  # would repeat the label of everything unlabelled
    robots.attach("a")
    robots.attach("b")  # past the cap
    assert robots.labelled == ["a"]
    robots.served(OTHER, "ok", 1.0, 1.0, 1.0, 0)
    robots.served("b", "ok", 1.0, 1.0, 1.0, 0)
    text = robots.exposition()
    assert text.count(b'servo_robot_requests_total{robot="other",outcome="ok"}') == 1
    assert sample(text, "servo_robot_requests_total", robot=OTHER, outcome="ok") == 2
