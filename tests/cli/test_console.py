"""The terminal: a status line that log lines never run into, cut to the terminal's width."""

from __future__ import annotations

import io
import threading

import pytest

from servo.cli.console import Console


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


ERASE = "\r\x1b[K"


def test_log_lines_clear_the_status_line_and_it_comes_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    out = Terminal()
    console = Console(out)
    console.status("[STREAMING] ticks 1")
    console.write("2026-11-23 [info] engine state\n")
    text = out.getvalue()
    assert text == f"{ERASE}[STREAMING] ticks 1{ERASE}2026-11-23 [info] engine state\n[STREAMING] ticks 1"
    # on screen: the log line on its own line, the status line below it
    assert text.split("\n")[0].endswith("2026-11-23 [info] engine state")


def test_status_line_never_wraps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    out = Terminal()
    console = Console(out)
    console.status("x" * 100)
    drawn = out.getvalue().removeprefix(ERASE)
    assert len(drawn) < 40
    assert drawn.endswith("…")


def test_partial_writes_are_joined_into_lines() -> None:
    out = Terminal()
    console = Console(out)
    console.status("S")
    console.write("half ")
    console.write("a line\nand ")
    console.write("another\n")
    assert out.getvalue() == f"{ERASE}S{ERASE}half a line\nS{ERASE}and another\nS"


def test_not_a_terminal_gets_log_lines_only() -> None:
    out = io.StringIO()
    console = Console(out)
    console.status("S")
    console.write("line\n")
    console.clear_status()
    console.say("done")
    assert out.getvalue() == "line\ndone\n"


def test_lines_from_many_threads_stay_whole() -> None:
    out = Terminal()
    console = Console(out)
    console.status("S")

    def spam(tag: str) -> None:
        for i in range(200):
            console.write(f"{tag}{i}\n")

    threads = [threading.Thread(target=spam, args=(t,)) for t in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = out.getvalue().replace(ERASE, "\n").split("\n")
    logged = [line for line in lines if line and line != "S"]
    assert sorted(logged) == sorted([f"{t}{i}" for t in "ab" for i in range(200)])
