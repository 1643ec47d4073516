"""Fixtures of the router tests: credentials for the whole module, a fresh router per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.router.harness import Auth, Credentials, Net, fleet_toml
from tests.support import free_port


@pytest.fixture(scope="package")
def creds(tmp_path_factory: pytest.TempPathFactory) -> Credentials:
    return Credentials(tmp_path_factory.mktemp("fleet"))


@pytest.fixture(params=["mtls", "usrpwd", "tls-usrpwd"])
def auth(request: pytest.FixtureRequest) -> Auth:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def net(auth: Auth, creds: Credentials, tmp_path: Path) -> Iterator[Net]:
    port = free_port()
    fleet_file = tmp_path / "fleet.toml"
    fleet_file.write_text(fleet_toml(auth, port, creds.pki, creds.passwords))
    network = Net(auth, creds, fleet_file, port)
    try:
        yield network
    finally:
        network.close()
