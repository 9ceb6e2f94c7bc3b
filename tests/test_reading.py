import os
import threading

import pytest

from ffnlab._util.reading import MiB, check_readable, kind_problem, read_bytes, read_text


def test_a_regular_file_and_a_link_to_one_are_read_whole(tmp_path):
    (tmp_path / "a.json").write_text('{"x": "é"}', encoding="utf-8")
    (tmp_path / "link.json").symlink_to(tmp_path / "a.json")
    assert read_text(tmp_path / "a.json", "the config file") == '{"x": "é"}'
    assert read_bytes(tmp_path / "link.json", "the config file", limit=64) == '{"x": "é"}'.encode()
    assert kind_problem(tmp_path / "a.json") is None


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/urandom", "/dev/null"])
def test_a_device_or_a_link_to_one_is_refused_unopened(tmp_path, target):
    link = tmp_path / "config.json"
    link.symlink_to(target)
    for path in (target, link):
        with pytest.raises(ValueError, match=rf"^the config file {path} is a character device.*; give a regular file$"):
            read_text(path, "the config file")


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "tokenizer.json"
    os.mkfifo(fifo)
    outcome = []
    reader = threading.Thread(target=lambda: outcome.append(kind_problem(fifo)), daemon=True)
    reader.start()
    reader.join(timeout=10)  # an open() of a FIFO with no writer would block for ever
    assert outcome and "FIFO" in outcome[0]
    with pytest.raises(ValueError, match="tokenizer.json is a FIFO"):
        check_readable(fifo, "the tokenizer")


def test_a_folder_a_dangling_link_and_a_missing_file_are_told_apart(tmp_path):
    (tmp_path / "dangling.json").symlink_to(tmp_path / "gone.json")
    with pytest.raises(ValueError, match="dangling.json is a symbolic link to .*gone.json, which does not exist"):
        check_readable(tmp_path / "dangling.json", "the tokenizer")
    with pytest.raises(ValueError, match="is a folder"):
        check_readable(tmp_path, "the config file")
    with pytest.raises(FileNotFoundError, match="missing.json does not exist"):
        check_readable(tmp_path / "missing.json", "the config file")


def test_a_file_over_the_limit_is_refused_after_reading_no_more_than_the_limit(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b"x" * (2 * MiB + 1))
    assert len(read_bytes(big, "the config file", limit=2 * MiB + 1)) == 2 * MiB + 1
    with pytest.raises(ValueError, match=r"big.json is larger than 2 MiB"):
        read_bytes(big, "the config file", limit=2 * MiB)


def test_text_that_is_not_utf8_is_named_with_its_first_bad_byte(tmp_path):
    (tmp_path / "latin1.json").write_bytes(b'{"x": "\xe9"}')
    with pytest.raises(ValueError, match=r"latin1.json is not UTF-8 text \(byte 0xe9 at 7\)"):
        read_text(tmp_path / "latin1.json", "the config file")


def test_data_reads_take_no_limit_and_a_size_limit_can_be_checked_unread(tmp_path):
    data = tmp_path / "train.txt"
    data.write_bytes(b"x" * (3 * MiB))
    assert len(read_text(data, "the data file", limit=None)) == 3 * MiB  # data files may be gigabytes
    assert check_readable(data, "the weights file", limit=3 * MiB) == data
    with pytest.raises(ValueError, match=r"^the generation config .*train.txt is larger than 2 MiB"):
        check_readable(data, "the generation config", limit=2 * MiB)


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="needs /proc/self/mem")
def test_a_read_that_fails_is_one_line_naming_the_file(tmp_path):
    link = tmp_path / "tokenizer.json"
    link.symlink_to("/proc/self/mem")  # a regular file whose every read fails (EIO), even for root
    with pytest.raises(ValueError, match=r"^the tokenizer .*tokenizer.json cannot be read \(Input/output error\)$"):
        read_text(link, "the tokenizer")
