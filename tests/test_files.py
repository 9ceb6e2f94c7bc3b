import os

import pytest

from ffnlab._util.files import atomic_path, write_atomic


def test_atomic_path_renames_onto_the_target_only_when_the_block_succeeds(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with atomic_path(target) as tmp:
        assert tmp.parent == tmp_path and tmp != target
        tmp.write_bytes(b"new")
        assert target.read_bytes() == b"old"  # nothing is visible before the rename
    assert target.read_bytes() == b"new"
    with pytest.raises(RuntimeError), atomic_path(str(target)) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("disk full")
    assert target.read_bytes() == b"new" and os.listdir(tmp_path) == ["out.bin"]


def test_atomic_path_checks_the_target_first(tmp_path):
    with pytest.raises(ValueError, match="is a folder"), atomic_path(tmp_path):
        pass
    with pytest.raises(ValueError, match="does not exist"), atomic_path(tmp_path / "missing" / "out.json"):
        pass


def test_a_read_only_folder_is_named_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # as root (CI containers) chmod would not do
    with pytest.raises(ValueError, match=f"cannot write .*out.json: the folder {tmp_path} is not writable"):
        write_atomic(tmp_path / "out.json", "{}")  # was '[Errno 13] Permission denied: .out.json.PID.tmp'
    assert os.listdir(tmp_path) == []


def test_write_atomic_writes_text_and_bytes(tmp_path):
    assert write_atomic(tmp_path / "a.txt", "héllo") == tmp_path / "a.txt"
    write_atomic(tmp_path / "b.bin", b"\x00\x01")
    assert (tmp_path / "a.txt").read_text(encoding="utf-8") == "héllo"
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert sorted(os.listdir(tmp_path)) == ["a.txt", "b.bin"]
