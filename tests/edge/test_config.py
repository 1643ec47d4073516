"""EdgeConfig: defaults < TOML < flags, and every bad value names its option."""

from __future__ import annotations

from pathlib import Path

import pytest

from servo.cli.edge import build_parser
from servo.cli.flags import struct_flag_values
from servo.config import fields_of
from servo.edge.config import EdgeConfig, EdgeConfigError, load_config


def load(tmp_path: Path, toml: str | None, *flags: str) -> EdgeConfig:
    path = None
    if toml is not None:
        file = tmp_path / "edge.toml"
        file.write_text(toml)
        path = str(file)
    args = build_parser().parse_args(["--robot", "sim", *flags])
    return load_config(path, struct_flag_values(args, EdgeConfig))


def test_defaults_are_the_seeds_defaults(tmp_path: Path) -> None:
    config = load(tmp_path, None)
    assert config == EdgeConfig()
    # jpeg_quality: "auto" since issue 10 (the seeds' default was 90).
    assert (config.jpeg_quality, config.buffer_time_s, config.max_action_age_s) == ("auto", 0.5, 3.0)
    assert (config.degraded_after_s, config.request_timeout_s) == (1.0, 5.0)
    assert (config.reconnect_initial_backoff_s, config.reconnect_max_backoff_s) == (0.5, 10.0)
    assert (config.max_offline_s, config.fallback, config.rtc) == (60.0, "hold", True)


def test_toml_then_flags(tmp_path: Path) -> None:
    toml = """
connect = ["tcp/10.0.0.1:7447"]
buffer_time_s = 0.8
max_action_age_s = 2
fallback = "zero"
rtc = false
tags = {site = "lab"}
"""
    config = load(
        tmp_path,
        toml,
        "--buffer-time-s",
        "0.3",
        "--rtc",
        "--tags",
        "fleet=a",
        "--tags",
        "n=7",
        "--policy-options",
        "chunk_size=20",
    )
    assert config.buffer_time_s == 0.3  # flag beats file
    assert config.rtc is True
    assert config.fallback == "zero"  # file beats default
    assert config.max_action_age_s == 2.0
    assert config.connect == ["tcp/10.0.0.1:7447"]
    assert config.tags == {"fleet": "a", "n": "7"}  # flags replace the table; values stay text
    assert config.policy_options == {"chunk_size": 20}  # JSON-decoded
    assert config.request_timeout_s == 5.0  # untouched default


def test_repeatable_connect_flag_replaces_the_file(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        'connect = ["tcp/10.0.0.1:7447"]',
        "--connect",
        "tcp/127.0.0.1:1",
        "--connect",
        "tcp/127.0.0.1:2",
    )
    assert config.connect == ["tcp/127.0.0.1:1", "tcp/127.0.0.1:2"]


@pytest.mark.parametrize(
    ("toml", "flags", "option"),
    [
        ("buffer_time_s = 0", (), "buffer_time_s"),
        ("", ("--max-action-age-s", "-1"), "max_action_age_s"),
        ("degraded_after_s = 0.0", (), "degraded_after_s"),
        ("", ("--request-timeout-s", "0"), "request_timeout_s"),
        ("connect_timeout_s = -2", (), "connect_timeout_s"),
        ("max_offline_s = 0", (), "max_offline_s"),
        ("jpeg_quality = 101", (), "jpeg_quality"),
        ("", ("--jpeg-quality", "-1"), "jpeg_quality"),
        ("timeout_streak = 0", (), "timeout_streak"),
        ("reconnect_initial_backoff_s = 0", (), "reconnect_initial_backoff_s"),
        (
            "reconnect_initial_backoff_s = 5.0\nreconnect_max_backoff_s = 1.0",
            (),
            "reconnect_initial_backoff_s",
        ),
        ("execution_horizon = -1", (), "execution_horizon"),
        ("connect = []", (), "connect"),
        ('connect = ["localhost"]', (), r"connect\[0\] = 'localhost': not an endpoint"),
        ("lease_ms = 10", (), "lease_ms"),
        ('buffer_time_s = "fast"', (), "buffer_time_s"),
        ('fallback = "coast"', (), "fallback"),
        ("rtc = 3", (), "rtc"),
        ("tags = {a = 1}", (), "tags"),
        ("", ("--tags", "novalue"), "--tags"),
        ('trusted_servers = ["ed25519:short"]', (), r"trusted_servers = \['ed25519:short'\]: fingerprint"),
        ("", ("--trusted-servers", "a/b"), "trusted_servers.*trusted replica id 'a/b' contains '/'"),
        ('client_id = "robot\\u001b[2J"', (), r"client_id.*control character"),
        ('auth_user = "robot-7"', (), "auth_password_file: user/password authentication needs both"),
        ('auth_user = "robot-7"\nauth_password_file = "/no/such"', (), "auth_password_file.*does not exist"),
        ("max_chunk_steps = 5000", (), "max_chunk_steps"),
    ],
)
def test_bad_values_name_the_option(tmp_path: Path, toml: str, flags: tuple[str, ...], option: str) -> None:
    with pytest.raises(EdgeConfigError, match=option):
        load(tmp_path, toml, *flags)


def test_unknown_option(tmp_path: Path) -> None:
    with pytest.raises(EdgeConfigError) as info:
        load(tmp_path, "buffer_time = 0.5")
    assert "edge.toml: buffer_time: unknown key (valid: app, auth_password_file, auth_user, buffer_time_s," in str(
        info.value
    )


def test_bad_value_names_file_option_and_value(tmp_path: Path) -> None:
    with pytest.raises(EdgeConfigError) as info:
        load(tmp_path, "buffer_time_s = -1")
    assert str(info.value).endswith("edge.toml: buffer_time_s = -1: expected float > 0.0")
    with pytest.raises(EdgeConfigError) as info:
        load(tmp_path, None, "--jpeg-quality", "200")
    assert str(info.value) == "command line: jpeg_quality = 200: expected int <= 100"


def test_every_flag_has_a_sentence_of_help() -> None:
    text = build_parser().format_help()
    for doc in fields_of(EdgeConfig):
        assert doc.description, doc.name
        assert "--" + doc.name.replace("_", "-") in text
    assert "Send the next observation when the queue holds less than" in " ".join(text.split())
    # each robot's real options are listed, with their help
    assert "port (str, required): Serial port of the servo bus" in text
    assert "width (" not in text


def test_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(EdgeConfigError, match="cannot read"):
        load_config(str(tmp_path / "missing.toml"))
    with pytest.raises(EdgeConfigError, match="invalid TOML"):
        load(tmp_path, "buffer_time_s = = 1")


def test_choices_are_checked_by_the_parser() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--robot", "sim", "--fallback", "coast"])


def test_a_password_fleet_robot_joins_as_its_user(tmp_path: Path) -> None:
    secret = tmp_path / "robot-7.secret"
    secret.write_text("pw-of-robot-7\n")
    config = load(tmp_path, None, "--auth-user", "robot-7", "--auth-password-file", str(secret))
    settings = config.zenoh_settings()
    assert settings.auth is not None
    assert (settings.auth.user, settings.auth.password_file) == ("robot-7", str(secret))
    assert config.resolved_client_id("random") == "robot-7"  # the router names it by its user
    assert load(tmp_path, None).resolved_client_id("random") == "random"


@pytest.mark.parametrize(("flag", "expected"), [("auto", "auto"), ("0", 0), ("75", 75)])
def test_jpeg_quality_flag_takes_auto_or_a_number(tmp_path: Path, flag: str, expected: object) -> None:
    assert load(tmp_path, None, "--jpeg-quality", flag).jpeg_quality == expected


def test_a_bad_jpeg_quality_flag_is_one_line_naming_it(tmp_path: Path) -> None:
    with pytest.raises(EdgeConfigError, match="jpeg_quality"):
        load(tmp_path, None, "--jpeg-quality", "101")
