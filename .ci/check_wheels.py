"""Check the wheels and the sdist ``make wheels`` built before anyone installs them.

    .venv/bin/python .ci/check_wheels.py dist

For x86_64 and aarch64 there must be exactly one ``servo_robotics-<version>-cp311-abi3-
manylinux_2_28_<arch>.whl`` in the directory, and for each:

* ``auditwheel show`` finds it consistent with manylinux_2_28 or an older, wider policy;
* its extension is an ELF object for that architecture, needs no GLIBC symbol version newer
  than 2.28 (read from ``.gnu.version_r`` with pyelftools, which auditwheel brings) and no
  library outside the manylinux whitelist;
* its metadata names the distribution ``servo-robotics`` at the project's version.

The x86_64 wheel is then installed into a fresh venv with its dependencies from PyPI, where
``import servo`` must come from that venv, agree with the installed metadata, be a release
build, merge and pop an ActionQueue chunk correctly, and import the edge without torch (the
edge install has no torch). The aarch64 wheel cannot run on this host; its checks are static,
plus: every dependency, the cameras extra included, has an aarch64 wheel on PyPI.
The sdist must hold the Rust and Python sources a build from source needs, and no ``.so``.

Prints one line per check and ends with ``N passed, M failed``; exits 1 if any failed.
"""

from __future__ import annotations

import email.parser
import re
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import tomllib
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec, TypeVar

from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection

REPO = Path(__file__).resolve().parent.parent
DISTRIBUTION = "servo-robotics"
GLIBC_FLOOR = (2, 28)
#: pyelftools' e_machine name of each wheel architecture.
ARCHES = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64"}
#: What a manylinux wheel may link against without bundling it: the part of the manylinux
#: whitelist a Rust extension can reach, and the dynamic loaders.
SYSTEM_LIBRARIES = frozenset(
    {
        *("libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libgcc_s.so.1"),
        *("ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"),
    }
)
T = TypeVar("T")
P = ParamSpec("P")

# Runs inside the fresh venv, from a directory outside the repository.
SMOKE = textwrap.dedent(
    """
    import importlib.metadata, pathlib, sys
    import numpy as np
    import servo, servo._core as core

    assert pathlib.Path(servo.__file__).resolve().is_relative_to(pathlib.Path(sys.prefix).resolve()), servo.__file__
    installed = importlib.metadata.version("servo-robotics")
    assert servo.__version__ == installed == sys.argv[1], (servo.__version__, installed, sys.argv[1])
    assert core.build_profile == "release", core.build_profile
    queue = core.ActionQueue(2, rtc=True)
    chunk = np.arange(10, dtype=np.float32).reshape(5, 2)
    assert queue.merge(chunk, chunk * 10, 2) == 2  # RTC: the first 2 steps went by during inference
    assert queue.qsize() == 3
    assert queue.get().tolist() == [40.0, 50.0]
    assert queue.get_left_over().tolist() == [[6.0, 7.0], [8.0, 9.0]]
    import servo.cli.edge, servo.edge
    assert "torch" not in sys.modules, "the edge imported torch"
    import importlib.resources
    page = importlib.resources.files("servo").joinpath("monitor", "static")  # servo.monitor needs the extra
    assert all(page.joinpath(name).is_file() for name in ("index.html", "monitor.js", "monitor.css")), "monitor page"
    print(f"servo {servo.__version__} from {pathlib.Path(servo.__file__).parent}")
    """
)


class Report:
    """Counts and prints check outcomes. Owned by the main thread."""

    def __init__(self) -> None:
        self.passed = 0
        self.failed = 0

    def check(self, name: str, run: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T | None:
        """Run one check; ``run(*args)`` returns what it found (printed) or raises to fail it."""
        try:
            found = run(*args, **kwargs)
        except Exception as exc:  # reported, and the next check still runs
            self.failed += 1
            print(f"FAIL {name}: {exc}", flush=True)
            return None
        self.passed += 1
        print(f"ok   {name}: {found}", flush=True)
        return found


def project_version() -> str:
    """The version in pyproject.toml (the wheel's and, through Cargo.toml, ``servo.__version__``)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    if project["name"] != DISTRIBUTION:
        raise SystemExit(f"pyproject.toml names {project['name']!r}, expected {DISTRIBUTION!r}")
    return str(project["version"])


def find_wheel(dist: Path, version: str, arch: str) -> Path:
    """The one wheel for ``arch``."""
    name = f"servo_robotics-{version}-cp311-abi3-manylinux_2_28_{arch}.whl"
    found = sorted(dist.glob(f"servo_robotics-*{arch}.whl"))
    if [w.name for w in found] != [name]:
        raise ValueError(f"expected exactly {name} in {dist}, found {[w.name for w in found]}")
    return found[0]


def auditwheel_policy(wheel: Path, arch: str) -> str:
    """``auditwheel show`` must place the wheel at manylinux_2_28 or an older policy."""
    out = subprocess.run(
        [sys.executable, "-m", "auditwheel", "show", str(wheel)], capture_output=True, text=True, check=True
    ).stdout
    match = re.search(r'consistent with\s+the following platform tag:\s+"manylinux_(\d+)_(\d+)_(\w+)"', out)
    if match is None:
        raise ValueError(" ".join(out.split()))
    glibc, tag_arch = (int(match[1]), int(match[2])), match[3]
    if tag_arch != arch or glibc > GLIBC_FLOOR:
        raise ValueError(f"auditwheel: manylinux_{glibc[0]}_{glibc[1]}_{tag_arch}")
    return f"auditwheel: manylinux_{glibc[0]}_{glibc[1]}_{tag_arch}"


def extension_abi(wheel: Path, arch: str) -> str:
    """The extension's machine, newest GLIBC version and needed libraries."""
    with zipfile.ZipFile(wheel) as archive:
        (so_name,) = [n for n in archive.namelist() if n.endswith(".so")]
        if so_name != "servo/_core.abi3.so":
            raise ValueError(f"extension is {so_name}, expected servo/_core.abi3.so")
        with tempfile.TemporaryFile() as so:
            so.write(archive.read(so_name))
            elf = ELFFile(so)
            machine = elf["e_machine"]
            versions: set[tuple[int, ...]] = set()
            for section in elf.iter_sections():
                if isinstance(section, GNUVerNeedSection):
                    for _, aux in section.iter_versions():
                        versions.update(
                            tuple(int(part) for part in a.name.removeprefix("GLIBC_").split("."))
                            for a in aux
                            if re.fullmatch(r"GLIBC_[\d.]+", a.name)
                        )
            dynamic = elf.get_section_by_name(".dynamic")
            if not isinstance(dynamic, DynamicSection):
                raise ValueError(f"{so_name} has no .dynamic section")
            needed = {tag.needed for tag in dynamic.iter_tags() if tag.entry.d_tag == "DT_NEEDED"}
    newest = max(versions)
    foreign = needed - SYSTEM_LIBRARIES
    if machine != ARCHES[arch]:
        raise ValueError(f"{so_name} is {machine}, expected {ARCHES[arch]}")
    if newest > GLIBC_FLOOR:
        raise ValueError(f"needs GLIBC_{'.'.join(map(str, newest))} > 2.28")
    if foreign:
        raise ValueError(f"links libraries outside manylinux: {sorted(foreign)}")
    return f"{machine}, newest GLIBC_{'.'.join(map(str, newest))}, needs {sorted(needed)}"


def metadata(wheel: Path, version: str, arch: str) -> str:
    """Name, version, Python floor and extras as a user's pip sees them."""
    with zipfile.ZipFile(wheel) as archive:
        text = archive.read(f"servo_robotics-{version}.dist-info/METADATA").decode()
        wheel_tags = archive.read(f"servo_robotics-{version}.dist-info/WHEEL").decode()
    meta = email.parser.Parser().parsestr(text)
    extras = set(meta.get_all("Provides-Extra") or [])
    if (meta["Name"], meta["Version"], meta["Requires-Python"]) != (DISTRIBUTION, version, ">=3.11"):
        raise ValueError(f"Name/Version/Requires-Python are {meta['Name']}/{meta['Version']}/{meta['Requires-Python']}")
    if not {"server", "cameras"} <= extras:
        raise ValueError(f"extras are {sorted(extras)}")
    (tag,) = re.findall(r"^Tag: (.+)$", wheel_tags, re.MULTILINE)
    if tag != f"cp311-abi3-manylinux_2_28_{arch}":
        raise ValueError(f"WHEEL says {tag}")
    return f"{meta['Name']} {meta['Version']}, {tag}, extras {sorted(extras)}"


def binary_dependencies(wheel: Path, arch: str) -> str:
    """Every dependency (cameras extra included) has a wheel for ``arch``: an edge compiles nothing."""
    with tempfile.TemporaryDirectory(prefix="servo-deps-") as tmp:
        download = subprocess.run(
            [
                *(sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check"),
                *("--only-binary=:all:", "--platform", f"manylinux_2_28_{arch}", "--python-version", "3.11"),
                *("--implementation", "cp", "--dest", tmp, f"{wheel}[cameras]"),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if download.returncode != 0:
            raise ValueError(download.stderr.strip()[-2000:])
        return f"{len(list(Path(tmp).glob('*.whl'))) - 1} dependency wheels resolve for manylinux_2_28_{arch}"


def sdist(dist: Path, version: str) -> str:
    """The source distribution holds what a build from source needs, and no built extension."""
    path = dist / f"servo_robotics-{version}.tar.gz"
    with tarfile.open(path) as archive:
        names = {name.removeprefix(f"servo_robotics-{version}/") for name in archive.getnames()}
        info = archive.extractfile(f"servo_robotics-{version}/PKG-INFO")
        meta = email.parser.BytesParser().parse(info) if info is not None else None
    missing = {
        "PKG-INFO",
        "pyproject.toml",
        "Cargo.toml",
        "Cargo.lock",
        "rust/lib.rs",
        "python/servo/_core.pyi",
        "python/servo/monitor/static/index.html",
    } - names
    if missing:
        raise ValueError(f"{path.name} lacks {sorted(missing)}")
    if built := sorted(n for n in names if n.endswith(".so")):
        raise ValueError(f"{path.name} holds built extensions {built}")
    if meta is None or (meta["Name"], meta["Version"]) != (DISTRIBUTION, version):
        raise ValueError(f"{path.name} PKG-INFO names {meta and (meta['Name'], meta['Version'])}")
    return f"{path.name}, {len(names)} files"


def install_and_run(wheel: Path, version: str) -> str:
    """Install into a fresh venv (dependencies from PyPI) and exercise it there."""
    with tempfile.TemporaryDirectory(prefix="servo-wheel-") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        python = str(venv / "bin" / "python")
        pip = subprocess.run(
            [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel)],
            capture_output=True,
            text=True,
            check=False,
        )
        if pip.returncode != 0:
            raise ValueError(f"pip install failed: {pip.stderr.strip()[-2000:]}")
        env = {"PATH": str(venv / "bin"), "HOME": tmp}  # nothing from the repository's environment
        smoke = subprocess.run([python, "-c", SMOKE, version], capture_output=True, text=True, cwd=tmp, env=env)
        if smoke.returncode != 0:
            raise ValueError(smoke.stderr.strip()[-2000:])
        edge_help = subprocess.run(
            [str(venv / "bin" / "servo-edge"), "--help"], capture_output=True, text=True, cwd=tmp, env=env
        )
        if edge_help.returncode != 0 or "--robot" not in edge_help.stdout:
            raise ValueError(f"servo-edge --help: {edge_help.stderr.strip()[-2000:]}")
        return smoke.stdout.strip().replace(tmp, "<tmp>") + "; servo-edge --help works"


def main() -> int:
    """Check every wheel in the directory given as the only argument."""
    dist = Path(sys.argv[1] if len(sys.argv) > 1 else "dist")
    version = project_version()
    report = Report()
    for arch in ARCHES:
        wheel = report.check(f"{arch} wheel", find_wheel, dist, version, arch)
        if wheel is None:
            continue
        report.check(f"{wheel.name} policy", auditwheel_policy, wheel, arch)
        report.check(f"{wheel.name} extension", extension_abi, wheel, arch)
        report.check(f"{wheel.name} metadata", metadata, wheel, version, arch)
        if arch == "x86_64":
            report.check(f"{wheel.name} fresh venv", install_and_run, wheel, version)
        else:
            report.check(f"{wheel.name} dependencies", binary_dependencies, wheel, arch)
    report.check("sdist", sdist, dist, version)
    print(f"{report.passed} passed, {report.failed} failed")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
