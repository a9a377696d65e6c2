"""Shared set-up of the Python tests: the `pipeweave` command the reports are compared with.

The package must be installed (`pip install ./python`); the tests import it as users do (run
them from this folder, as .ci/python does, so the checkout's sources do not shadow it)."""

import os
import shutil

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pipeweave_bin():
    """The CLI: $PIPEWEAVE_BIN, else the release build of this checkout, else `pipeweave` on PATH."""
    candidates = [os.environ.get("PIPEWEAVE_BIN"), os.path.join(ROOT, "target", "release", "pipeweave")]
    for c in candidates:
        if c and os.path.exists(c):
            return c
    return shutil.which("pipeweave")


@pytest.fixture(scope="session")
def cli():
    path = pipeweave_bin()
    if path is None:
        pytest.skip("the pipeweave command is not built (cargo build --release)")
    return path
