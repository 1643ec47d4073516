"""The fleet file: what it accepts, and one line naming the key for every mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from servo.config import ConfigError
from servo.router import Fleet, access_control, parse_fleet
from tests.pki import Pki


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fleet directory: certificates under certs/, a passwords file."""
    base = tmp_path_factory.mktemp("fleet")
    pki = Pki(base / "certs", "ca")
    pki.issue("router", ip="127.0.0.1")
    (base / "passwords").write_text("gpu-0:a\nrobot-7:b\n\nrobot-8 : c\n")
    return base


MTLS = """
[router]
listen = ["tls/127.0.0.1:7447"]
[router.tls]
certificate = "certs/router.pem"
private_key = "certs/router.key"
root_ca = "certs/ca.pem"
"""
PASSWORDS = """
[router]
listen = ["tcp/127.0.0.1:7447"]
passwords_file = "passwords"
"""
MEMBERS = """
[[servers]]
names = ["gpu-0"]
[[robots]]
names = ["robot-7", "robot-8"]
"""


def parse(text: str, base: Path) -> Fleet:
    return parse_fleet(text, origin="fleet.toml", base_dir=base)


def refusal(text: str, base: Path) -> str:
    with pytest.raises(ConfigError) as info:
        parse(text, base)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("fleet.toml: ")
    return message.removeprefix("fleet.toml: ")


def test_an_mtls_fleet_names_members_by_certificate_and_resolves_paths(fleet_dir: Path) -> None:
    fleet = parse(MTLS + MEMBERS + '[[monitors]]\nnames = ["dashboard"]\n', fleet_dir)
    assert fleet.identified_by == "cert_common_names"
    assert fleet.router.tls is not None
    assert fleet.router.tls.root_ca == str(fleet_dir / "certs/ca.pem")
    counts = [fleet.count(role) for role in ("servers", "robots", "monitors", "routers")]
    assert counts == [1, 2, 1, 0]


def test_a_password_fleet_names_members_by_user(fleet_dir: Path) -> None:
    fleet = parse(PASSWORDS + MEMBERS, fleet_dir)
    assert fleet.identified_by == "usernames"
    acl = access_control(fleet)
    assert {"id": "robot:robot-8", "usernames": ["robot-8"]} in acl["subjects"]


def test_each_robot_rule_names_only_that_robot(fleet_dir: Path) -> None:
    acl = access_control(parse(MTLS + MEMBERS, fleet_dir))
    assert acl["default_permission"] == "deny"
    own = [rule for rule in acl["rules"] if rule["id"].startswith("robot:robot-7/")]
    assert own
    for rule in own:
        assert all("/c/robot-7/" in key or key == "@servo/@robots/robot-7/telemetry" for key in rule["key_exprs"]), rule
    for rule in acl["rules"]:
        assert not any("robot-8" in key for key in rule["key_exprs"]) or rule["id"].startswith("robot:robot-8/")


def test_a_server_group_is_limited_to_its_apps_and_models(fleet_dir: Path) -> None:
    group = '[[servers]]\nnames = ["gpu-0"]\napps = ["kitchen"]\nmodels = ["pi0"]\n'
    acl = access_control(parse(MTLS + group, fleet_dir))
    declared = next(r for r in acl["rules"] if "declare_queryable" in r["messages"])
    assert declared["key_exprs"] == [
        "@servo/kitchen/pi0/*/status",
        "@servo/kitchen/pi0/*/trajectory",
        "@servo/kitchen/pi0/*/audit",
        "@servo/kitchen/pi0/*/c/*/session",
        "@servo/kitchen/pi0/*/c/*/control",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            MTLS + "[[robots]]\nnames = ['robot-7']\nname = 'x'\n",
            "robots[0].name: unknown key (valid: identities, names)",
        ),
        (
            MTLS.replace("listen =", "lisen =") + MEMBERS,
            "router.lisen: unknown key (valid: connect, lease_ms, listen, passwords_file, tls)",
        ),
        (MTLS + MEMBERS + "[[monitors]]\nnames = ['robot-7']\n", "monitors[0].names[0] = 'robot-7': already listed at"),
        (MTLS + "[[robots]]\nnames = ['robot-7', 'robot-7']\n", "robots[0].names[1] = 'robot-7': already listed at"),
        (
            MTLS.replace("certs/router.pem", "certs/nope.pem") + MEMBERS,
            "router.tls.certificate: file '",
        ),
        (
            MTLS.replace("router.key", "TMP").replace("router.pem", "router.key").replace("TMP", "router.pem")
            + MEMBERS,
            "router.tls.certificate: '",
        ),
        (MTLS + "[[robots]]\nnames = ['robot 7']\n", "robots[0].names[0] = 'robot 7': a robot's name is its client id"),
        (MTLS + "[[robots]]\nnames = []\n", "robots[0].names = []: expected array of length >= 1"),
        (MTLS + "[[servers]]\nnames = ['g']\napps = ['a/b']\n", "servers[0].apps[0] = 'a/b': a key segment or \"*\""),
        (
            MTLS.replace("tls/127", "udp/127") + MEMBERS,
            "router.listen[0] = 'udp/127.0.0.1:7447': expected str matching",
        ),
        (MTLS.replace("tls/127", "tcp/127") + MEMBERS, "router.listen[0] = 'tcp/127.0.0.1:7447': under mTLS"),
        (MTLS.replace('root_ca = "certs/ca.pem"', "") + MEMBERS, "router.tls.root_ca: required when mtls = true"),
        (
            MTLS.replace("[router.tls]", 'passwords_file = "passwords"\n[router.tls]') + MEMBERS,
            "router.passwords_file: members are named by certificate",
        ),
        (PASSWORDS.replace("tcp/", "tls/") + MEMBERS, "router.listen[0] = 'tls/127.0.0.1:7447': a tls/ endpoint needs"),
        (PASSWORDS.replace('passwords_file = "passwords"', "") + MEMBERS, "router: nobody can be identified"),
        (MTLS.replace('root_ca = "certs/ca.pem"', "mtls = false") + MEMBERS, "router: nobody can be identified"),
        (PASSWORDS + "[[robots]]\nnames = ['robot-9']\n", "robots[0].names[0] = 'robot-9': no line for it in"),
        (
            PASSWORDS.replace("listen =", "connect = ['tcp/10.0.0.2:7447']\nlisten =") + MEMBERS,
            "router.connect: joining other routers needs certificates",
        ),
        (MTLS.replace("listen =", "connect = ['tls/10.0.0.2:7447']\nlisten =") + MEMBERS, "routers: router.connect"),
        (MTLS, "fleet names nobody"),
        (MTLS + MEMBERS + "[router.extra]\n", "router.extra: unknown key"),
        ("[router\n", "invalid TOML"),
    ],
)
def test_a_mistake_is_one_line_naming_the_key(fleet_dir: Path, text: str, expected: str) -> None:
    assert refusal(text, fleet_dir).startswith(expected)


def test_a_bad_passwords_line_is_named_without_its_secret(fleet_dir: Path) -> None:
    bad = fleet_dir / "bad-passwords"
    bad.write_text("gpu-0:a\nrobot-7 hunter2\n")
    message = refusal(PASSWORDS.replace('"passwords"', '"bad-passwords"') + MEMBERS, fleet_dir)
    assert message == f"router.passwords_file: {str(bad)!r} line 2 is not name:password"
    assert "hunter2" not in message
