"""Doctests of ``inq``: the examples make their folders with ``tempfile.mkdtemp()``, as a user
would; here those folders go inside the test's ``tmp_path``, which pytest removes, not in the
system's temporary folder, where each test run would leave about twenty."""

import tempfile
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _examples_write_in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
