"""lattica._malloc: glibc's thresholds are raised once per process, never against the user's own
settings (run in fresh interpreters: the tuning is process-wide and happens once)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

GLIBC = sys.platform.startswith("linux") and bool(os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else "")
PROBE = "from lattica import _malloc; print(_malloc.tune(), _malloc.tune())"


def _run(**env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "LATTICA_MALLOC", "GLIBC_TUNABLES"))}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.skipif(not GLIBC, reason="mallopt thresholds exist on glibc only; elsewhere tune() is a no-op")
def test_tuned_once_on_glibc() -> None:
    assert _run() == "True False"


def test_the_users_settings_win() -> None:
    assert _run(MALLOC_TRIM_THRESHOLD_="131072") == "False False"
    assert _run(MALLOC_MMAP_THRESHOLD_="131072") == "False False"
    assert _run(LATTICA_MALLOC_TUNING="0") == "False False"
    assert _run(GLIBC_TUNABLES="glibc.malloc.trim_threshold=131072") == "False False"


def test_a_python_without_ctypes_just_skips_it() -> None:
    """Best effort: where ctypes cannot load (no libffi), tune() says no and nothing breaks."""
    probe = "import sys; sys.modules['ctypes'] = None; " + PROBE
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "LATTICA_MALLOC"))}
    out = subprocess.run([sys.executable, "-c", probe], env=clean, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "False False", out.stderr
