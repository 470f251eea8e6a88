"""The device locks' folder: made for every user of the machine, and refused in one line where it
cannot be had (no process is started)."""

from __future__ import annotations

import stat

import pytest

from anatomy.engine.locks import LOCK_DIR_ENV, DeviceBusy, DeviceLock


def test_the_lock_folder_anatomy_makes_is_every_users(tmp_path, monkeypatch):
    """The first user's umask made it 0755 and its files 0644: every other user's run was then
    refused (or a PermissionError traceback) for as long as the machine kept /tmp."""
    monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path / "made" / "locks"))
    lock = DeviceLock("gpu0")
    assert lock.acquire("run 1 (pid 1)")
    lock.release()
    assert stat.S_IMODE((tmp_path / "made" / "locks").stat().st_mode) == 0o1777  # as /tmp
    assert stat.S_IMODE((tmp_path / "made" / "locks" / "gpu0.lock").stat().st_mode) == 0o666
    assert DeviceLock("gpu0").holder() == "run 1 (pid 1)"


def test_a_folder_the_user_named_keeps_its_own_mode(tmp_path, monkeypatch):
    tmp_path.chmod(0o700)
    monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path))
    assert DeviceLock("cpu").acquire("a watch")
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o700


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_a_lock_folder_that_cannot_be_had_is_refused_in_one_line(tmp_path, monkeypatch, capsys,
                                                                 where):
    """$ANATOMY_LOCK_DIR naming a file (or a read-only place): a FileExistsError or OSError
    traceback from `anatomy run`, `sweep` and the phase API before."""
    (tmp_path / "file").write_text("")
    folder = tmp_path / "file" if where == "a file" else tmp_path / "file" / "locks"
    monkeypatch.setenv(LOCK_DIR_ENV, str(folder))
    with pytest.raises(DeviceBusy, match=r"cpu\.lock cannot be opened: .*ANATOMY_LOCK_DIR"):
        DeviceLock("cpu").acquire("run 1")
    from anatomy import cli

    assert cli.main(["run", "--model", "tiny", "--store", str(tmp_path / "s.sqlite")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "cannot be opened" in error, error
