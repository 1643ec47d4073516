"""EdgeConfig: defaults < TOML < flags, and every bad value names its option."""

from __future__ import annotations

from pathlib import Path

import pytest

from servo.cli.edge import build_parser
from servo.cli.flags import options_of, struct_flag_values
from servo.config import ConfigError
from servo.edge.config import FLAG_KEYS, EdgeConfig, load_edge_config


def load(tmp_path: Path, toml: str | None, *flags: str) -> EdgeConfig:
    path = None
    if toml is not None:
        file = tmp_path / "edge.toml"
        file.write_text(toml)
        path = str(file)
    args = build_parser().parse_args(["--robot", "sim", *flags])
    return load_edge_config(path, struct_flag_values(args, EdgeConfig))


def test_defaults_are_the_seeds_defaults(tmp_path: Path) -> None:
    config = load(tmp_path, None)
    assert config == EdgeConfig()
    # jpeg_quality: "auto" since issue 10 (the seeds' default was 90).
    assert (config.link.jpeg_quality, config.pipeline.buffer_time_s, config.control.max_action_age_s) == (
        "auto",
        0.5,
        3.0,
    )
    assert (config.failsafe.degraded_after_s, config.failsafe.request_timeout_s) == (1.0, 5.0)
    assert (config.link.reconnect_initial_backoff_s, config.link.reconnect_max_backoff_s) == (0.5, 10.0)
    assert (config.failsafe.max_offline_s, config.control.fallback, config.pipeline.rtc) == (60.0, "hold", True)


def test_toml_then_flags(tmp_path: Path) -> None:
    toml = """
tags = {site = "lab"}

[link]
connect = ["tls/10.0.0.1:7447"]

[pipeline]
buffer_time_s = 0.8
rtc = false

[control]
max_action_age_s = 2
fallback = "zero"
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
    assert config.pipeline.buffer_time_s == 0.3  # flag beats file
    assert config.pipeline.rtc is True
    assert config.control.fallback == "zero"  # file beats default
    assert config.control.max_action_age_s == 2.0
    assert config.link.connect == ["tls/10.0.0.1:7447"]
    assert config.tags == {"fleet": "a", "n": "7"}  # flags replace the table; values stay text
    assert config.local.policy_options == {"chunk_size": 20}  # JSON-decoded
    assert config.failsafe.request_timeout_s == 5.0  # untouched default


def test_repeatable_connect_flag_replaces_the_file(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        '[link]\nconnect = ["tcp/10.0.0.1:7447"]',
        "--connect",
        "tcp/127.0.0.1:1",
        "--connect",
        "tcp/127.0.0.1:2",
    )
    assert config.link.connect == ["tcp/127.0.0.1:1", "tcp/127.0.0.1:2"]


@pytest.mark.parametrize(
    ("toml", "flags", "option"),
    [
        ("[pipeline]\nbuffer_time_s = 0", (), r"pipeline\.buffer_time_s = 0: expected float > 0"),
        ("", ("--max-action-age-s", "-1"), r"control\.max_action_age_s = -1"),
        ("[failsafe]\ndegraded_after_s = 0.0", (), "failsafe.degraded_after_s"),
        ("", ("--request-timeout-s", "0"), "failsafe.request_timeout_s"),
        ("[link]\nconnect_timeout_s = -2", (), "link.connect_timeout_s"),
        ("[failsafe]\nmax_offline_s = 0", (), "failsafe.max_offline_s"),
        ("[link]\njpeg_quality = 101", (), "link.jpeg_quality"),
        ("", ("--jpeg-quality", "-1"), "link.jpeg_quality"),
        ("[failsafe]\ntimeout_streak = 0", (), "failsafe.timeout_streak"),
        ("[link]\nreconnect_initial_backoff_s = 0", (), "link.reconnect_initial_backoff_s"),
        (
            "[link]\nreconnect_initial_backoff_s = 5.0\nreconnect_max_backoff_s = 1.0",
            (),
            "link.reconnect_initial_backoff_s = 5.0: must be <= reconnect_max_backoff_s",
        ),
        ("[pipeline]\nexecution_horizon = -1", (), "pipeline.execution_horizon"),
        ("[link]\nconnect = []", (), "link.connect"),
        ('[link]\nconnect = ["localhost"]', (), r"link\.connect\[0\] = 'localhost': not an endpoint"),
        ("[link]\nlease_ms = 10", (), "link.lease_ms"),
        ('[pipeline]\nbuffer_time_s = "fast"', (), "pipeline.buffer_time_s"),
        ('[control]\nfallback = "coast"', (), "control.fallback"),
        ("[control]\nvelocity_scale = 11", (), r"control\.velocity_scale = 11: expected float <= 10"),
        ("[pipeline]\nrtc = 3", (), "pipeline.rtc"),
        ("tags = {a = 1}", (), "tags"),
        ("", ("--tags", "novalue"), "--tags"),
        (
            '[security]\ntrusted_servers = ["ed25519:short"]',
            (),
            r"security\.trusted_servers = \['ed25519:short'\]: fingerprint",
        ),
        ("", ("--trusted-servers", "a/b"), "security.trusted_servers.*trusted replica id 'a/b' contains '/'"),
        ('client_id = "robot\\u001b[2J"', (), r"client_id.*control character"),
        (
            '[security]\nauth_user = "robot-7"',
            (),
            "security.auth_password_file: user/password authentication needs both",
        ),
        (
            '[security]\nauth_user = "robot-7"\nauth_password_file = "/no/such"',
            (),
            "security.auth_password_file.*does not exist",
        ),
        ("[security]\nmax_chunk_steps = 5000", (), "security.max_chunk_steps"),
        ("[pipeline]\nbuffer_tim_s = 0.5", (), r"pipeline\.buffer_tim_s: unknown key \(valid: buffer_time_s,"),
        (
            '[link]\nconnect = ["tcp/10.0.0.1:7447"]',
            (),
            r"link\.connect\[0\] = 'tcp/10.0.0.1:7447'.*not TLS.*--insecure",
        ),
        ("", ("--connect", "tcp/0.0.0.0:7447"), r"link\.connect\[0\].*not TLS and not loopback"),
    ],
)
def test_bad_values_name_the_option(tmp_path: Path, toml: str, flags: tuple[str, ...], option: str) -> None:
    with pytest.raises(ConfigError, match=option):
        load(tmp_path, toml, *flags)


@pytest.mark.parametrize(
    "endpoint",
    ["tcp/127.0.0.1:7447", "tcp/127.1.2.3:7447", "tcp/[::1]:7447", "tcp/localhost:7447", "tls/10.0.0.1:7447"],
)
def test_loopback_and_tls_connect_without_insecure(tmp_path: Path, endpoint: str) -> None:
    assert load(tmp_path, f'[link]\nconnect = ["{endpoint}"]').link.connect == [endpoint]


def test_plain_tcp_to_another_host_is_an_explicit_choice(tmp_path: Path) -> None:
    config = load(tmp_path, '[link]\nconnect = ["tcp/10.0.0.1:7447"]\n[security]\ninsecure = true')
    assert config.security.insecure
    assert config.link.connect == ["tcp/10.0.0.1:7447"]


def test_unknown_option(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, "buffer_time = 0.5")
    assert "edge.toml: buffer_time: unknown key (valid: client_id, control, failsafe, inference, link," in str(
        info.value
    )


@pytest.mark.parametrize(("name", "key"), sorted(FLAG_KEYS.items()))
def test_a_key_of_the_flat_layout_names_its_section_in_one_line(tmp_path: Path, name: str, key: str) -> None:
    if name == key:
        assert load(tmp_path, f"{name} = {{}}" if name == "tags" else f'{name} = "rtc"' if name == "inference" else "")
        return
    section = key.split(".")[0]
    with pytest.raises(ConfigError) as info:
        load(tmp_path, f"{name} = 1")
    assert str(info.value) == f"{tmp_path / 'edge.toml'}: {name} moved: use [{section}] {name}"


def test_every_option_has_one_flag_named_after_it_and_one_dotted_key() -> None:
    options = {doc.name for doc in options_of(EdgeConfig)}
    assert options == set(FLAG_KEYS)
    assert len(set(FLAG_KEYS.values())) == len(FLAG_KEYS)
    for section in ("link", "server", "security", "pipeline", "control", "failsafe", "local"):
        assert any(key.startswith(section + ".") for key in FLAG_KEYS.values()), section


def test_bad_value_names_file_option_and_value(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, "[pipeline]\nbuffer_time_s = -1")
    assert str(info.value).endswith("edge.toml: pipeline.buffer_time_s = -1: expected float > 0.0")
    with pytest.raises(ConfigError) as info:
        load(tmp_path, None, "--jpeg-quality", "200")
    assert str(info.value) == "command line: link.jpeg_quality = 200: expected int <= 100"


def test_every_flag_has_a_sentence_of_help_under_its_section() -> None:
    text = build_parser().format_help()
    for doc in options_of(EdgeConfig):
        assert doc.description, doc.name
        assert "--" + doc.name.replace("_", "-") in text
    assert "The next observation leaves at the latest when the queue holds less than" in " ".join(text.split())
    # the help groups the flags by section, in the file's order
    sections = [text.index(f"\n[{name}] ") for name in ("link", "server", "security", "pipeline", "control")]
    assert sections == sorted(sections)
    assert sections[3] < text.index("\n  --buffer-time-s") < sections[4]
    # each robot's real options are listed, with their help
    assert "port (str, required): Serial port of the servo bus" in text
    assert "width (" not in text


def test_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_edge_config(str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError, match="invalid TOML"):
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
    assert load(tmp_path, None, "--jpeg-quality", flag).link.jpeg_quality == expected


def test_a_bad_jpeg_quality_flag_is_one_line_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="jpeg_quality"):
        load(tmp_path, None, "--jpeg-quality", "101")
