import pytest
from hypothesis import given
from hypothesis import strategies as st

from servo.wire import ServerKeys, WireError, segment, slugify, status_selector

HOSTILE = [
    "",
    "*",
    "**",
    "a*b",
    "$*",
    "a?b",
    "a#b",
    "a/b",
    "/a",
    "a/",
    "//",
    "@servo",
    "@x",
    "a b",
    "\t",
]


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_segments_are_rejected(value: str) -> None:
    with pytest.raises(WireError):
        segment(value, what="client_id")


def test_rejection_names_the_segment_and_the_character() -> None:
    with pytest.raises(WireError, match=r"client_id 'robot\*' contains '\*'"):
        segment("robot*", what="client_id")
    with pytest.raises(WireError, match="client_id must not be empty"):
        segment("", what="client_id")
    with pytest.raises(WireError, match="limit is 128"):
        segment("x" * 129)


@given(st.text())
def test_slugify_output_is_always_a_valid_segment_or_an_error(text: str) -> None:
    try:
        slug = slugify(text)
    except WireError:
        return
    assert segment(slug) == slug
    assert set(slug) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


@given(st.text())
def test_segment_never_lets_key_syntax_through(text: str) -> None:
    try:
        seg = segment(text)
    except WireError:
        return
    assert not set(seg) & set("*$?#/")
    assert seg
    assert not seg.startswith("@")


def test_slugify_model_ids() -> None:
    assert slugify("lerobot/pi0_towels") == "lerobot-pi0_towels"
    assert slugify("  fold the towel!! ") == "fold-the-towel"
    with pytest.raises(WireError):
        slugify("///")


def test_server_keys_layout() -> None:
    keys = ServerKeys("kitchen", "act-so100", "gpu0")
    assert keys.prefix == "@servo/kitchen/act-so100/gpu0"
    assert keys.status == "@servo/kitchen/act-so100/gpu0/status"
    assert keys.all_obs == "@servo/kitchen/act-so100/gpu0/c/*/obs"
    assert "**" not in keys.all_obs + keys.all_control + keys.all_client_alive
    client = keys.client("arm-7")
    assert client.obs == "@servo/kitchen/act-so100/gpu0/c/arm-7/obs"
    assert client.action == "@servo/kitchen/act-so100/gpu0/c/arm-7/action"
    assert keys.client_of(client.obs) == "arm-7"
    assert keys.client_of(client.alive) == "arm-7"
    assert ServerKeys.parse_status(keys.status) == keys


@pytest.mark.parametrize(
    "key",
    [
        "@servo/kitchen/act-so100/gpu1/c/arm/obs",
        "@servo/kitchen/act-so100/gpu0/c/arm/obs/extra",
        "@servo/kitchen/act-so100/gpu0/obs",
    ],
)
def test_client_of_refuses_foreign_keys(key: str) -> None:
    with pytest.raises(WireError):
        ServerKeys("kitchen", "act-so100", "gpu0").client_of(key)


def test_server_keys_refuse_hostile_parts() -> None:
    with pytest.raises(WireError):
        ServerKeys("kitchen", "**", "gpu0")
    with pytest.raises(WireError):
        ServerKeys("kitchen", "m", "gpu0").client("a/b")


def test_status_selector() -> None:
    assert status_selector() == "@servo/*/*/*/status"
    assert status_selector("lab", "act") == "@servo/lab/act/*/status"
    with pytest.raises(WireError):
        status_selector("**")
