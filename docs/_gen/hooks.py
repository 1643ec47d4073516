"""MkDocs hooks: the reference pages generated from the code at build time (nothing generated is committed).

- ``reference/cli.md``: every console script's parser (`reference_cli`);
- ``reference/manifest.md``, ``reference/edge-config.md``, ``reference/fleet.md``: every field of the
  server manifest, the edge options and the fleet file (`reference_config`);
- ``reference/api/``: the ``servo`` namespace and each subpackage's public names (`reference_api`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import reference_api
import reference_cli
import reference_config
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
API_DIR = "reference/api/"
API_INDEX = API_DIR + "index.md"


def generated_pages() -> dict[str, str]:
    """Every generated page: its path under ``docs/`` -> its Markdown."""
    from servo.edge.config import EdgeConfig
    from servo.router.fleet import Fleet
    from servo.server.manifest import Manifest

    commands = reference_cli.commands(ROOT / "pyproject.toml")
    edge_flags = {a.dest: a.option_strings[0] for c in commands if c.name == "servo-edge" for a in c.parser._actions}
    pages = {
        "reference/cli.md": reference_cli.markdown(commands),
        "reference/manifest.md": reference_config.markdown(
            "Server manifest",
            "Every key of the manifest `servo-serve` reads (`examples/manifest.toml` shows them at their "
            "defaults; [Configuration](../guides/configuration.md) explains how the files work). "
            "Generated from `servo.server.manifest.Manifest`.",
            Manifest,
        ),
        "reference/edge-config.md": reference_config.markdown(
            "Edge options",
            "Every option of `servo-edge`, as a key of its `--config` TOML file and as a flag (flags win "
            "over the file; `examples/edge.toml` shows them at their defaults). Generated from "
            "`servo.edge.config.EdgeConfig`.",
            EdgeConfig,
            flag_of=lambda field: edge_flags.get(field.name),
        ),
        "reference/fleet.md": reference_config.markdown(
            "Fleet file",
            "Every key of the fleet file `servo-router` reads (servers read only its `[[robots]]`; "
            "`examples/fleet.toml` explains each). Generated from `servo.router.fleet.Fleet`.",
            Fleet,
        ),
    }
    api = reference_api.pages(reference_api.collect(ROOT / "python"))
    pages.update({API_DIR + path: text for path, text in api.items()})
    return pages


def on_files(files: Files, config: MkDocsConfig, **_: Any) -> Files:
    """Add the generated pages to the site, and the API modules' pages to the nav under ``API_INDEX``."""
    pages = generated_pages()
    for path, text in pages.items():
        files.append(File.generated(config, path, content=text))
    modules = sorted(path for path in pages if path.startswith(API_DIR) and path != API_INDEX)
    _expand(config.nav or [], modules)
    return files


def _expand(nav: list[Any], modules: list[str]) -> None:
    """Replace the nav entry that names ``API_INDEX`` by a section: the index, then every module page."""
    for i, item in enumerate(nav):
        title, target = next(iter(item.items())) if isinstance(item, dict) else (None, item)
        if target == API_INDEX:
            nav[i] = {title or "API": [{"The servo namespace": API_INDEX}, *modules]}
        elif isinstance(target, list):
            _expand(target, modules)
