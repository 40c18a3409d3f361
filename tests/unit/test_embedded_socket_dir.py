"""Where the embedded server's Unix socket goes: under TMPDIR when a socket path fits there,
else in a short fallback, else a one-line error naming TMPDIR."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tunefleet.db.embedded import SOCKET_PATH_MAX, EmbeddedServer, datadir
from tunefleet.errors import EmbeddedServerError


def _deep_dir(tmp_path: Path) -> Path:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    return deep


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # Not under tmp_path: a parallel session's tmp_path may itself be too deep.
    path = Path(tempfile.mkdtemp(prefix="tf-", dir="/tmp"))
    yield path
    path.rmdir()


def test_the_socket_goes_under_a_short_tmpdir(
    tmp_path: Path, short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    short = short_dir
    monkeypatch.setattr(tempfile, "tempdir", str(short))
    sock = EmbeddedServer(tmp_path / "data").socket_dir()
    assert sock.parent == short
    assert len(str(sock / ".s.PGSQL.65535.lock")) <= SOCKET_PATH_MAX


def test_a_tmpdir_too_deep_for_a_socket_falls_back_to_a_short_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = _deep_dir(tmp_path)
    assert len(str(deep)) > SOCKET_PATH_MAX
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    sock = EmbeddedServer(tmp_path / "data").socket_dir()
    assert sock.parent == Path("/tmp")
    # One data directory, one socket directory: the name does not depend on TMPDIR.
    monkeypatch.setattr(tempfile, "tempdir", "/tmp")
    assert EmbeddedServer(tmp_path / "data").socket_dir() == sock


def test_no_directory_short_enough_is_one_line_naming_tmpdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = _deep_dir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    monkeypatch.setattr(datadir, "SHORT_TEMP_DIRS", (str(tmp_path / "missing"), str(deep)))
    with pytest.raises(EmbeddedServerError) as err:
        EmbeddedServer(tmp_path / "data").socket_dir()
    message = str(err.value)
    assert "\n" not in message
    assert str(deep) in message and "TMPDIR" in message
