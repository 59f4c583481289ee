"""The real SGLang sources for tests: each wheel downloaded once, its ``.py`` files unpacked once.

Tests read SGLang statically (never import it), so only the Python sources and the dist-info are
unpacked, into ``<cache>/sglang-<version>/site/`` (a folder usable as a ``site-packages`` on ``PYTHONPATH``).
`SGLANG_VERSIONS` are the releases checked: 0.5.23, which the emulator follows, and 0.5.14 and 0.5.18, which
SpecForge 0.2.0 and SpecForge's main branch pin.
The cache is ``$EAGLE3_TEST_CACHE`` or ``~/.cache/eagle3-tui-tests``.  ``$EAGLE3_SGLANG_WHEEL`` may point
at a 0.5.23 wheel file already on disk (offline machines); ``$EAGLE3_SGLANG_WHEELS`` at a folder of wheels.

Safe with parallel pytest-xdist workers: each worker downloads and unpacks into its own temporary folder
and moves the result into place with one rename; a worker that loses the race uses the winner's copy.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

SGLANG_VERSION = "0.5.23"
SGLANG_VERSIONS = ("0.5.14", "0.5.18", "0.5.23")
CACHE_ENV = "EAGLE3_TEST_CACHE"
WHEEL_ENV = "EAGLE3_SGLANG_WHEEL"
WHEELS_DIR_ENV = "EAGLE3_SGLANG_WHEELS"


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "eagle3-tui-tests")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def sglang_wheel(version: str = SGLANG_VERSION) -> Path:
    """The wheel file of ``version`` (downloaded with ``pip download --no-deps`` on first use)."""
    given = os.environ.get(WHEEL_ENV)
    if given and version == SGLANG_VERSION:
        return Path(given)
    given_dir = os.environ.get(WHEELS_DIR_ENV)
    if given_dir:
        local = sorted(Path(given_dir).glob(f"sglang-{version}-*.whl"))
        if local:
            return local[0]
    wheels = cache_dir() / "wheels"
    found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0]
    wheels.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=wheels, prefix=".download-") as tmp:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
             # the same wheel whatever runs the tests (only its .py files are read)
             "--only-binary=:all:", "--implementation", "cp", "--python-version", "3.11",
             "--platform", "manylinux_2_34_x86_64", "-d", tmp, f"sglang=={version}"],
            check=False,
            capture_output=True,
            text=True,
            timeout=600,
        )
        got = sorted(Path(tmp).glob(f"sglang-{version}-*.whl"))
        if proc.returncode != 0 or not got:
            raise RuntimeError(
                f"could not download sglang=={version} (needed to test against real SGLang source; "
                f"set {WHEEL_ENV} to a local wheel when offline):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            )
        target = wheels / got[0].name
        os.replace(got[0], target)  # atomic: a concurrent worker's identical file may be replaced, harmless
    return target


def sglang_site(version: str = SGLANG_VERSION) -> Path:
    """A folder holding ``sglang/`` (all its ``.py`` files) and ``sglang-<version>.dist-info/``."""
    final = cache_dir() / f"sglang-{version}" / "site"
    if (final / "sglang" / "srt" / "server_args.py").is_file():
        return final
    wheel = sglang_wheel(version)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=".extract-"))
    try:
        with zipfile.ZipFile(wheel) as zf:
            for member in zf.namelist():
                wanted = (member.startswith("sglang/") and member.endswith(".py")) or (
                    member.startswith(f"sglang-{version}.dist-info/") and not member.endswith("/")
                )
                if wanted and ".." not in Path(member).parts:
                    zf.extract(member, tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "sglang" / "srt" / "server_args.py").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def sglang_root(version: str = SGLANG_VERSION) -> Path:
    """The ``sglang`` package folder (the one holding ``srt/``) of SGLang ``version``."""
    return sglang_site(version) / "sglang"


def sglang_0_5_23_wheel() -> Path:
    return sglang_wheel(SGLANG_VERSION)


def sglang_0_5_23_site() -> Path:
    return sglang_site(SGLANG_VERSION)


def sglang_0_5_23_root() -> Path:
    return sglang_root(SGLANG_VERSION)
