"""One way to commit a file or a folder (rl.fsio): all or nothing, and the
leftovers of dead writers swept."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO

from rl.fsio import CorruptFile, commit_dir, read_json, sweep_temporaries


def test_commit_dir_is_all_or_nothing(tmp_path: Path) -> None:
    final = tmp_path / "entry"

    def broken(tmp: Path) -> None:
        (tmp / "half").write_text("x")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        commit_dir(final, broken)
    assert list(tmp_path.iterdir()) == []  # nothing half-built is left, under any name
    assert commit_dir(final, lambda tmp: (tmp / "a").write_text("1")) is True
    assert commit_dir(final, lambda tmp: (tmp / "a").write_text("2")) is False  # the first commit stands
    assert (final / "a").read_text() == "1" and sorted(p.name for p in tmp_path.iterdir()) == ["entry"]


def test_sweep_removes_what_dead_writers_left(tmp_path: Path) -> None:
    (tmp_path / ".v1.tmp-abc").mkdir()
    (tmp_path / ".f.json.tmp-def").write_text("{")
    (tmp_path / "v1").mkdir()
    assert sweep_temporaries(tmp_path) == 2 and [p.name for p in tmp_path.iterdir()] == ["v1"]


def test_a_garbage_json_file_is_named_in_the_error(tmp_path: Path) -> None:
    (tmp_path / "empty.json").write_text("")
    (tmp_path / "torn.json").write_text('{"a": ')
    for name, why in (("empty.json", "empty"), ("torn.json", "not JSON")):
        with pytest.raises(CorruptFile) as e:
            read_json(tmp_path / name)
        assert str(tmp_path / name) in str(e.value) and why in str(e.value)
    assert read_json(tmp_path / "missing.json") is None


def test_the_commit_code_exists_once() -> None:
    """Only rl/fsio.py renames a temporary into place."""
    offenders = []
    for path in [*REPO.glob("rl/**/*.py"), *REPO.glob("jobs/*.py")]:
        text = path.read_text()
        if path.name != "fsio.py" and ("os.rename(" in text or "os.replace(" in text or "mkdtemp(dir=" in text):
            offenders.append(str(path.relative_to(REPO)))
    # weights retention renames a version away before deleting it: a removal, not a commit
    assert offenders == ["rl/store/weights.py"], offenders
    assert (REPO / "rl/store/weights.py").read_text().count("os.rename(") == 1
