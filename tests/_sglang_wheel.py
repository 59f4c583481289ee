"""The real SGLang 0.5.23 source for tests: the wheel, downloaded once, its ``.py`` files unpacked once.

Tests read SGLang statically (never import it), so only the Python sources and the dist-info are
unpacked, into ``<cache>/sglang-0.5.23/site/`` (a folder usable as a ``site-packages`` on ``PYTHONPATH``).
The cache is ``$EAGLE3_TEST_CACHE`` or ``~/.cache/eagle3-tui-tests``.  ``$EAGLE3_SGLANG_WHEEL`` may point
at a wheel file already on disk (offline machines).

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
CACHE_ENV = "EAGLE3_TEST_CACHE"
WHEEL_ENV = "EAGLE3_SGLANG_WHEEL"


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "eagle3-tui-tests")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def sglang_0_5_23_wheel() -> Path:
    """The wheel file (downloaded with ``pip download --no-deps`` on first use)."""
    given = os.environ.get(WHEEL_ENV)
    if given:
        return Path(given)
    wheels = cache_dir() / "wheels"
    found = sorted(wheels.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
    if found:
        return found[0]
    wheels.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=wheels, prefix=".download-") as tmp:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
             # the same wheel whatever runs the tests (only its .py files are read)
             "--only-binary=:all:", "--implementation", "cp", "--python-version", "3.11",
             "--platform", "manylinux_2_34_x86_64", "-d", tmp, f"sglang=={SGLANG_VERSION}"],
            check=False,
            capture_output=True,
            text=True,
            timeout=600,
        )
        got = sorted(Path(tmp).glob(f"sglang-{SGLANG_VERSION}-*.whl"))
        if proc.returncode != 0 or not got:
            raise RuntimeError(
                f"could not download sglang=={SGLANG_VERSION} (needed to test against real SGLang source; "
                f"set {WHEEL_ENV} to a local wheel when offline):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            )
        target = wheels / got[0].name
        os.replace(got[0], target)  # atomic: a concurrent worker's identical file may be replaced, harmless
    return target


def sglang_0_5_23_site() -> Path:
    """A folder holding ``sglang/`` (all its ``.py`` files) and ``sglang-0.5.23.dist-info/``."""
    final = cache_dir() / f"sglang-{SGLANG_VERSION}" / "site"
    if (final / "sglang" / "srt" / "server_args.py").is_file():
        return final
    wheel = sglang_0_5_23_wheel()
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=".extract-"))
    try:
        with zipfile.ZipFile(wheel) as zf:
            for member in zf.namelist():
                wanted = (member.startswith("sglang/") and member.endswith(".py")) or (
                    member.startswith(f"sglang-{SGLANG_VERSION}.dist-info/") and not member.endswith("/")
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


def sglang_0_5_23_root() -> Path:
    """The ``sglang`` package folder (the one holding ``srt/``) of SGLang 0.5.23."""
    return sglang_0_5_23_site() / "sglang"
