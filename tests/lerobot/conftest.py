"""LeRobot suite: runs on Python >= 3.12 with servo-robotics[lerobot] (``make test-lerobot``), skipped elsewhere.

Every checkpoint is built here from random weights with LeRobot's ``save_pretrained``, once per
session; the hub is switched off so nothing can be downloaded.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Before LeRobot / transformers / huggingface_hub are imported: they read it at import time.
os.environ["HF_HUB_OFFLINE"] = "1"


@pytest.fixture(scope="session")
def act_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.lerobot.checkpoints import build_act

    return build_act(tmp_path_factory.mktemp("act"))


@pytest.fixture(scope="session")
def relative_act_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.lerobot.checkpoints import build_act

    return build_act(tmp_path_factory.mktemp("act_relative"), relative=True)


@pytest.fixture(scope="session")
def smolvla_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.lerobot.checkpoints import build_smolvla

    return build_smolvla(tmp_path_factory.mktemp("smolvla"))


@pytest.fixture(scope="session")
def relative_smolvla_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.lerobot.checkpoints import build_smolvla

    return build_smolvla(tmp_path_factory.mktemp("smolvla_relative"), relative=True)


@pytest.fixture(scope="session")
def diffusion_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.lerobot.checkpoints import build_diffusion

    return build_diffusion(tmp_path_factory.mktemp("diffusion"))
