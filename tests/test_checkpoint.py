"""Checkpoint folders: ffnlab deletes only the files it wrote, uses only folders it may, and reads
latest.json through the bounded reader (ffnlab/run/checkpoint.py)."""

import json
import os
import pickle
import re
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
from torch import nn

from ffnlab.run.checkpoint import (
    MARKER,
    CheckpointWarning,
    DamagedCheckpoint,
    check_checkpoint_folder,
    load_checkpoint,
    save_checkpoint,
    trainer_state,
)
from ffnlab.run.train import train
from tests.conftest import TINY_MODEL
from tests.test_train import _Evil, killed_at, tiny

# real files a user keeps, some named like the old pruning glob `*-*.*` or close to ffnlab's own names
USER_FILES = {
    "README.md": b"# my experiment\n",
    "data.csv": b"a,b\n1,2\n",
    "photo.jpg": b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(range(256)),
    "my-notes.txt": b"notes\n",
    "data-2024.csv": b"x\n1\n",
    "photo-1.jpg": b"\xff\xd8\xff\xdb" + bytes(64),
    "model-1.pt": b"mine",
    "model-01.safetensors": b"mine",
    "state-1.pt.bak": b"mine",
}


def write_user_files(folder):
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in USER_FILES.items():
        (folder / name).write_bytes(content)


def assert_user_files_kept(folder):
    assert {name: (folder / name).read_bytes() for name in USER_FILES} == USER_FILES


def linear_run():
    """A tiny model, optimizer, generator and scaler: what load_checkpoint fills in."""
    model = nn.Linear(2, 2)
    return model, torch.optim.AdamW(model.parameters()), torch.Generator(), torch.amp.GradScaler("cpu", enabled=False)


def save(folder, step):
    model, opt, gen, scaler = linear_run()
    save_checkpoint(folder, model, trainer_state(step, 0.0, {}, opt, gen, scaler))


def test_user_files_beside_an_unrelated_latest_json_are_refused_and_kept(run_cli, tmp_path):
    folder = tmp_path / "mine"
    write_user_files(folder)
    (folder / "latest.json").write_text('{"version": 3}')
    code, _, err = run_cli("train", *TINY_MODEL, "--steps", 2, "--checkpoint-dir", folder)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"the checkpoint folder {folder} holds files ffnlab did not write (" in err
    assert_user_files_kept(folder)
    assert (folder / "latest.json").read_text() == '{"version": 3}' and not (folder / MARKER).exists()
    with pytest.raises(ValueError, match="holds files ffnlab did not write"):
        load_checkpoint(folder, *linear_run())  # the library function refuses it too, whoever calls it
    with pytest.raises(ValueError, match="holds files ffnlab did not write"):
        save(folder, 1)
    assert_user_files_kept(folder)


def test_pruning_deletes_only_ffnlabs_older_pairs(tmp_path):
    folder = tmp_path / "ck"
    save(folder, 1)  # a new folder: ffnlab's from its first checkpoint on
    write_user_files(folder)  # the user's files, put there later, are kept
    save(folder, 2)
    save(folder, 3)
    assert_user_files_kept(folder)
    ffnlabs = {"latest.json", MARKER, "model-3.safetensors", "state-3.pt"}
    assert set(os.listdir(folder)) == ffnlabs | set(USER_FILES)


def test_a_damaged_checkpoint_is_discarded_by_ffnlabs_names_only(tmp_path):
    folder = tmp_path / "ck"
    save(folder, 4)
    write_user_files(folder)
    (folder / ".model-5.safetensors.123.tmp").write_bytes(b"left by a kill -9")
    (folder / "latest.json").write_text("{not json")
    discarded = pytest.warns(CheckpointWarning, match=f"discarding the unreadable checkpoint in {folder}")
    with discarded, pytest.raises(DamagedCheckpoint):
        load_checkpoint(folder, *linear_run())
    assert_user_files_kept(folder)
    assert set(os.listdir(folder)) == {MARKER} | set(USER_FILES)  # the folder stays ffnlab's


def test_a_refused_pickle_is_discarded_without_advice_to_load_it_unsafely(tmp_path):
    folder = tmp_path / "ck"
    save(folder, 4)
    (folder / "state-4.pt").write_bytes(pickle.dumps(_Evil(tmp_path / "pwned")))
    with pytest.warns(CheckpointWarning) as caught, pytest.raises(DamagedCheckpoint):
        load_checkpoint(folder, *linear_run())
    message = str(caught[0].message)
    assert "state-4.pt holds objects other than tensors and plain data, which ffnlab never loads" in message
    assert "weights_only" not in message and "Weights only" not in message, message  # torch's advice is not passed on
    assert not (tmp_path / "pwned").exists()


def test_an_unmarked_folder_with_an_unreadable_checkpoint_is_kept(tmp_path):
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "latest.json").write_text('{"version": 3}')  # only a name ffnlab uses, but not its file
    with pytest.raises(ValueError, match=f"the checkpoint folder {folder} holds a checkpoint ffnlab cannot read"):
        load_checkpoint(folder, *linear_run())
    assert os.listdir(folder) == ["latest.json"]


@pytest.mark.parametrize(
    "names, needle",
    [
        (["model-5.safetensors"], "but no latest.json and no .ffnlab-checkpoints marker"),
        (["sub/"], "holds files ffnlab did not write (sub)"),
        ([f"f{i}.txt" for i in range(5)], "(f0.txt, f1.txt, f2.txt and 2 more)"),
    ],
)
def test_a_folder_ffnlab_cannot_tell_as_its_own_is_refused(tmp_path, names, needle):
    folder = tmp_path / "ck"
    folder.mkdir()
    for name in names:
        (folder / name).mkdir() if name.endswith("/") else (folder / name).write_bytes(b"x")
    with pytest.raises(ValueError, match=r"^the checkpoint folder .*" + needle.replace("(", r"\(").replace(")", r"\)")):
        check_checkpoint_folder(folder)


def test_a_checkpoint_folder_must_be_a_folder_ffnlab_can_write(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file; give a folder"):
        check_checkpoint_folder(tmp_path / "file")
    with pytest.raises(ValueError, match="is not a writable folder"):
        check_checkpoint_folder(tmp_path / "file" / "ck")
    (tmp_path / "gone").symlink_to(tmp_path / "missing")
    with pytest.raises(ValueError, match="is a link to .*missing, which does not exist"):
        check_checkpoint_folder(tmp_path / "gone")
    assert check_checkpoint_folder(tmp_path / "new" / "ck") == tmp_path / "new" / "ck"  # made at the first checkpoint


def test_a_folder_the_previous_version_wrote_resumes_and_is_marked(tmp_path):
    """Checkpoints written before the marker existed (only ffnlab's names, a latest.json whose pair loads)
    resume as they did, and the folder is marked at its next checkpoint."""
    cfg = tiny(max_steps=8, checkpoint_every=3, eval_every=8, precision="fp32", final_eval_batches=1)
    full = train(cfg)
    folder = tmp_path / "ck"
    killed_at(cfg, folder, 4)
    (folder / MARKER).unlink()  # now as the previous version left it
    assert sorted(os.listdir(folder)) == ["latest.json", "model-3.safetensors", "state-3.pt"]
    resumed = train(replace(cfg, checkpoint_dir=str(folder)))
    assert resumed.history.train_loss == full.history.train_loss
    assert resumed.val.loss == full.val.loss
    assert sorted(os.listdir(folder)) == sorted([MARKER, "latest.json", "model-6.safetensors", "state-6.pt"])


def test_a_sweeps_checkpoint_that_is_a_link_fails_that_run_with_the_reason(tmp_path):
    from ffnlab.study.execute import checkpoint_dir, execute
    from ffnlab.study.plan import plan, run_id
    from ffnlab.study.store import Store
    from tests.test_sweep import smoke_study

    cfg = plan(smoke_study(seeds=1, variants=["relu"]))[0]
    store = tmp_path / "s.db"
    folder = checkpoint_dir(store, run_id(cfg))
    save(folder, 4)
    (folder / "latest.json").unlink()
    # a link to a regular file, not to /dev/zero: were it read here, this process would not be bounded
    (tmp_path / "elsewhere.json").write_text('{"step": 4}')
    (folder / "latest.json").symlink_to(tmp_path / "elsewhere.json")
    assert execute(cfg.to_dict(), str(store)) == "failed"
    with Store(store) as s:
        error = s.get(run_id(cfg)).error
    assert f"latest.json, which is a symbolic link to {tmp_path / 'elsewhere.json'}" in error, error


# a child with at most 2 GiB of address space, so that a read without bound fails there instead of exhausting
# the machine, runs `train` on each folder it is given and prints each exit status
LIMITED_CLI = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from ffnlab.cli import main
for folder in sys.argv[2:]:
    code = main(["train", *sys.argv[1].split(), "--steps", "2", "--quiet", "--checkpoint-dir", folder])
    print(f"exit {code}", flush=True)
    print(f"-- {folder}", file=sys.stderr, flush=True)
"""


@pytest.mark.slow
def test_a_latest_json_that_is_no_regular_file_is_refused_within_seconds_and_a_discard_warns_in_one_line(tmp_path):
    folders = {kind: tmp_path / kind / "checkpoints" / "0123abcd" for kind in ("zero", "fifo", "elsewhere", "damaged")}
    for folder in folders.values():
        save(folder, 4)  # a sweep's folder, marked
        (folder / "latest.json").unlink()
    (folders["zero"] / "latest.json").symlink_to("/dev/zero")
    os.mkfifo(folders["fifo"] / "latest.json")
    (tmp_path / "elsewhere.json").write_text('{"step": 4}')
    (folders["elsewhere"] / "latest.json").symlink_to(tmp_path / "elsewhere.json")
    (folders["damaged"] / "latest.json").write_text(json.dumps({"step": 9}))  # its pair is gone
    model = " ".join(map(str, TINY_MODEL))
    child = [sys.executable, "-c", LIMITED_CLI, model, *map(str, folders.values())]
    proc = subprocess.run(child, capture_output=True, text=True, timeout=120)  # a FIFO read would block for ever
    assert re.findall(r"(?m)^exit (\d+)$", proc.stdout) == ["2", "2", "2", "0"], proc.stderr
    said = dict(zip(folders, re.split(r"(?m)^-- .*\n", proc.stderr)))
    for kind in ("zero", "fifo", "elsewhere"):
        assert said[kind].startswith(
            f"ffnlab: error: the checkpoint folder {folders[kind]} holds latest.json, which is a"
        )
        assert said[kind].count("\n") == 1, said[kind]
    assert "which is a symbolic link to /dev/zero; ffnlab writes only regular files there" in said["zero"]
    assert (tmp_path / "elsewhere.json").read_text() == '{"step": 4}'  # never written through the link
    assert said["damaged"].startswith(
        f"ffnlab: warning: discarding the unreadable checkpoint in {folders['damaged']} ("
    )
    assert said["damaged"].count("\n") == 1, said["damaged"]  # one line, not Python's file:line and source line


def test_a_finished_runs_checkpoints_go_and_a_users_file_beside_them_stays(tmp_path):
    """A sweep removed a finished run's whole checkpoint folder (shutil.rmtree), a file the user put there too."""
    from ffnlab.run.checkpoint import remove_checkpoints

    folder = tmp_path / "run"
    folder.mkdir()
    for name in (".ffnlab-checkpoints", "latest.json", "model-3.safetensors", "state-3.pt", ".latest.json.99.tmp"):
        (folder / name).write_text("x")
    (folder / "notes.txt").write_text("mine")
    remove_checkpoints(folder)
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]
    (folder / "notes.txt").unlink()
    (folder / "latest.json").write_text("x")
    remove_checkpoints(folder)
    assert not folder.exists()
    remove_checkpoints(folder)  # nothing there: nothing to do
