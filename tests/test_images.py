"""Task image (ffnlab.data.images and the ViT parts of ffnlab.core.model): patches, loading, training, comparing."""

import csv
import json
import os
import re
import struct
import zlib
from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image

from ffnlab.core.model import ModelConfig, PatchEmbed, Transformer, image_tokens
from ffnlab.data import images as images_module
from ffnlab.data.images import load_images
from ffnlab.run.config import identity
from ffnlab.run.train import TrainConfig, train
from ffnlab.study.plan import run_id
from tests.conftest import TINY_MODEL

TINY_VIT = ModelConfig(task="image", n_layers=1, n_heads=2, d_model=32, image_size=8, patch_size=2, channels=1)
# a compare of two variants on digits: a few steps of the smallest model
TINY_IMAGE = ["--task", "image", "--data", "digits", *TINY_MODEL, "--steps", 4, "--eval-every", 2,
              "--eval-batches", 1, "--final-eval-batches", 2, "--warmup", 1]  # fmt: skip


def write_folder(root, sizes=None, classes=("cat", "dog"), per_class=4, mode="RGB"):
    """A folder of tiny PNGs, one subfolder per class; `sizes` gives each image's (width, height)."""
    gen = torch.Generator().manual_seed(0)
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            width, height = sizes[i] if sizes else (4, 4)
            channels = 3 if mode == "RGB" else 1
            pixels = torch.randint(0, 128, (height, width, channels), generator=gen) + 127 * c  # classes differ
            array = pixels.to(torch.uint8).numpy()
            Image.fromarray(array if mode == "RGB" else array[..., 0], mode).save(root / name / f"{i:03d}.png")
    return root


@pytest.mark.parametrize("pool, tokens", [("mean", 16), ("cls", 17)])
def test_patch_embed_makes_one_token_per_patch_and_a_class_token_first(pool, tokens):
    cfg = replace(TINY_VIT, pool=pool, channels=3)
    embed = PatchEmbed(cfg)
    images = torch.randn(5, 3, 8, 8)
    out = embed(images)
    assert out.shape == (5, tokens, 32) and image_tokens(cfg) == tokens
    # the second patch of the first row is pixels [0:2, 2:4] of every channel, flattened channel-first
    patch = images[:, :, 0:2, 2:4].reshape(5, -1)
    torch.testing.assert_close(out[:, tokens - 16 + 1], embed.proj(patch))
    if pool == "cls":
        assert torch.equal(out[:, 0], embed.cls_token.expand(5, -1))


def test_the_vit_classifies_images_with_bidirectional_attention():
    cfg = replace(TINY_VIT, n_classes=3, context=image_tokens(TINY_VIT))
    model = Transformer(cfg)
    logits, loss = model(torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 2, 0]))
    assert logits.shape == (4, 3) and loss is not None and loss.item() > 0
    assert not model.blocks[0].attn.causal
    assert model.attention_maps(torch.randn(2, 1, 8, 8)).shape == (2, 2, 16, 16)  # a map over patches


def test_image_size_must_be_a_multiple_of_the_patch_and_channels_1_or_3():
    with pytest.raises(ValueError, match="multiple of patch_size"):
        replace(TINY_VIT, image_size=9)
    with pytest.raises(ValueError, match="channels must be 1"):
        replace(TINY_VIT, channels=2)


@pytest.mark.parametrize("text_model", [dict(hf_config={"model_type": "llama"}), dict(init_from="pretrained/llama")])
def test_task_image_refuses_a_text_model_when_its_config_is_made(text_model):
    with pytest.raises(ValueError, match="task image trains ffnlab's own ViT; --hf-config and --from take text models"):
        TrainConfig(model=ModelConfig(task="image"), **text_model)


def test_an_image_folder_loads_with_its_subfolders_as_classes(tmp_path):
    root = write_folder(tmp_path / "pets", classes=("dog", "cat", "bird"), per_class=10)
    (root / "cat" / "notes.txt").write_text("not an image, skipped")
    images = load_images(str(root))
    assert images.classes == ["bird", "cat", "dog"] and images.channels == 3 and images.image_size == 4
    counts = {split: len(labels) for split, labels in images.labels.items()}
    assert counts == {"train": 24, "val": 3, "test": 3}  # per class 10% val, 10% test: one each
    for labels in images.labels.values():
        assert set(labels.tolist()) == {0, 1, 2}  # every class in every split
    assert images.images["train"].min() >= 0 and images.images["train"].max() <= 1
    normalised = images.normalised("train")
    torch.testing.assert_close(normalised.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-5, rtol=0)
    # the split does not depend on anything but the names: loading again gives the same
    again = load_images.__wrapped__(str(root))
    assert all(torch.equal(again.images[s], images.images[s]) for s in images.images)


def test_mixed_sizes_are_resized_to_image_size_or_refused(tmp_path):
    root = write_folder(tmp_path / "mixed", sizes=[(4, 4), (8, 8), (6, 3), (4, 4)], mode="L")
    with pytest.raises(ValueError, match=r"mixed sizes: 4x4 .*, 8x8 .*; give --image-size N"):
        load_images(str(root))
    images = load_images(str(root), image_size=4)
    assert images.images["train"].shape[1:] == (1, 4, 4) and images.channels == 1  # all greyscale: one channel
    assert load_images(str(root), image_size=4, channels=3).channels == 3


@pytest.mark.slow
def test_a_tiny_run_on_digits_finishes_with_accuracy():
    cfg = TrainConfig(model=replace(TINY_VIT, image_size=None, channels=None), data="digits", batch_size=32,
                      max_steps=40, eval_every=20, eval_batches=2, final_eval_batches=4, warmup_steps=3, lr=5e-3)  # fmt: skip
    r = train(cfg)
    assert r.status == "finished" and r.task == "image" and r.steps == 40
    assert 0 <= r.val.acc <= 1 and r.test.acc is not None and r.noisy_val.acc is not None
    assert r.val.acc > 0.2  # ten classes: chance is 0.1
    assert r.history.val[-1].loss < r.history.val[0].loss
    assert r.costs.tokens == 40 * 32 * 16  # 16 patches of 2x2 in an 8x8 digit
    assert r.config["model"]["image_size"] is None  # the stored config says what was asked: the data's size
    json.dumps(r.to_dict())


def test_image_fields_join_the_run_identity_only_off_their_defaults():
    base = TrainConfig(model=replace(TINY_VIT, image_size=None, channels=None), data="digits")
    assert run_id(base) != run_id(replace(base, model=replace(base.model, patch_size=4)))
    assert run_id(base) != run_id(replace(base, model=replace(base.model, image_size=16)))
    assert not {"image_size", "patch_size", "channels"} & set(identity(TrainConfig())["model"])  # stored ids kept


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda root: write_folder(root, classes=("cat",)), r"has one class folder with images \('cat'\); task image "
                                                             "needs at least two classes"),
        (lambda root: write_folder(root, per_class=2), "class 'cat' has 2 image\\(s\\); each class needs at least 3"),
        (lambda root: (write_folder(root), (root / "dog" / "001.png").write_bytes(b"not a png")),
         r"dog/001.png is not a readable image \(cannot identify image file"),
    ],
)  # fmt: skip
def test_bad_image_folders_get_one_line_and_exit_2(tmp_path, run_cli, make, message):
    root = tmp_path / "images"
    make(root)
    code, _, err = run_cli("train", "--task", "image", "--data", root, *TINY_MODEL, "--steps", 1)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert re.search(message, err), err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--data", "digits"], "'digits' is an image set (.*); give --task image"),
        (["--task", "image"], "task image reads a folder of class subfolders .* 'shakespeare' is no image folder"),
        (["--task", "image", "--data", "digits", "--patch-size", 3], "the images of 'digits' are 8x8, not a multiple "
                                                                     "of --patch-size 3"),
    ],
)  # fmt: skip
def test_image_data_that_does_not_fit_the_task_gets_one_line_and_exit_2(run_cli, argv, message):
    code, _, err = run_cli("train", *argv, *TINY_MODEL, "--steps", 1)
    assert code == 2 and len(err.strip().splitlines()) == 1 and re.search(message, err), err


@pytest.mark.slow
def test_compare_on_digits_ranks_by_accuracy_across_depths(tmp_path, run_cli):
    code, out, err = run_cli("compare", *TINY_IMAGE, "--variants", "relu,gelu", "--seeds", 2, "--depth-axis", "1,2", "--jobs", 1,
                             "--store", tmp_path / "s.db", "--json", "--no-report")  # fmt: skip
    assert code == 0, err
    cells = json.loads(out)["cells"]
    assert [c["axes"] for c in cells] == [{"depth": 1}, {"depth": 2}]
    for cell in cells:
        assert cell["metric"] == "final_val_acc" and cell["metric_direction"] == "higher"
        ranked = [row["mean"] for row in cell["variants"]]
        assert ranked == sorted(ranked, reverse=True)  # best first: the higher accuracy
        assert {row["ffn"] for row in cell["variants"]} == {"relu", "gelu"}


def test_an_image_study_reports_pixels_macro_f1_and_attention_over_patches(tmp_path, run_cli):
    """An image compare through the CLI: the report says images and patches, not a tokenizer or a text context;
    macro-F1 stands beside accuracy as for cls; the attention maps are drawn on the first validation image."""
    from ffnlab.study.report import fixed_input, report_data

    root = write_folder(tmp_path / "pets", per_class=4)  # 4x4 RGB, two classes
    store, table = tmp_path / "s.db", tmp_path / "t.csv"
    code, out, err = run_cli("compare", "--task", "image", "--data", root, *TINY_MODEL, "--steps", 2, "--eval-every", 2,
                             "--variants", "relu,gelu", "--seeds", 2, "--jobs", 1, "--store", store, "--csv", table,
                             "--json")  # fmt: skip
    assert code == 0, err
    printed = json.loads(out)
    settings = printed["settings"]
    assert settings["tokenizer"] is None and settings["tokens_per_run"] is None
    assert "context" not in settings["model"] and settings["model"]["patch_size"] == 2
    assert dict(settings["held_equal"])["budget"] == "2 steps of 4 images"
    assert all(0 <= row["final_val_macro_f1"] <= 1 for row in printed["variants"])
    assert all(row["final_val_macro_f1"] for row in csv.DictReader(table.open()))
    md = (tmp_path / "report" / "summary.md").read_text()
    assert f"| data | {root} (image) |" in md and "tokenizer" not in md and "val macro-F1" in md
    assert "2x2-pixel patches of the data's images, mean pooling" in md and "tokens per run" not in md
    page = (tmp_path / "report" / "report.html").read_text()
    assert "on the first validation image (class " in page and "its 4 patches of 2x2 pixels" in page
    assert "patches/s" in out + md + page and "FLOPs/patch" in page  # speed per patch, as a ViT's tokens are
    assert "tokens/s" not in md + page and "FLOPs/token" not in page
    assert (tmp_path / "report" / "figures" / "attention.png").is_file()
    attention = report_data(store).cells[0].attention
    assert not isinstance(attention, str), attention
    assert attention.text is None and set(attention.maps) == {"relu", "gelu"}
    cfg = TrainConfig(model=ModelConfig(task="image"), data=str(root))
    torch.testing.assert_close(fixed_input(cfg).ids, load_images(str(root)).normalised("val")[0])  # as trained on
    for maps in attention.maps.values():  # (heads, patches, patches): every query's weights sum to 1
        assert maps.shape == (2, 4, 4) and np.allclose(maps.sum(-1), 1, atol=1e-5)


def test_a_token_budget_for_images_is_said_in_patches():
    """--max-tokens of an image study counts patches (a ViT's tokens); what it held equal said 'tokens'."""
    from ffnlab.study.plan import Study
    from ffnlab.study.summary import held_equal

    base = TrainConfig(model=ModelConfig(task="image", n_classes=2), data="images", max_tokens=4096)
    held = lambda **kw: dict(held_equal(Study(["relu", "gelu"], 2, base, **kw)).held_equal)["budget"]
    assert held() == "4,096 patches"
    assert held(axes={"tokens": [4096, 8192]}) == "patches per the tokens axis (4096, 8192)"
    assert (
        dict(held_equal(Study(["relu", "gelu"], 2, replace(base, model=ModelConfig()))).held_equal)["budget"]
        == "4,096 tokens"
    )


# ---- bounds: sizes and kinds read from the headers, before any image is decoded ----------------------


def huge_png(path, side):
    """A valid side x side greyscale PNG of zeros, written a row at a time: a few hundred KB on disk and in memory
    however many pixels it has (a 12000x12000 one decoded whole took 4.3 GB)."""
    chunk = lambda kind, data: (
        struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    )
    packer, row = zlib.compressobj(9), bytes(side + 1)  # each row: filter byte 0, then its pixels
    data = b"".join(packer.compress(row) for _ in range(side)) + packer.flush()
    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)  # 8-bit greyscale, no interlace
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b""))
    return path


def test_an_oversized_image_is_refused_from_its_header_before_any_image_is_decoded(tmp_path, run_cli, monkeypatch):
    root = write_folder(tmp_path / "images", mode="L")
    huge = huge_png(root / "dog" / "000.png", 12000)
    assert huge.stat().st_size < 1 << 20
    monkeypatch.setattr(images_module, "read_image", lambda *a: pytest.fail("an image was decoded"))
    code, _, err = run_cli("train", "--task", "image", "--data", root, *TINY_MODEL, "--steps", 1)
    assert code == 2 and err.count("\n") == 1 and "DecompressionBomb" not in err, err  # Pillow's warning: gone
    assert f"{huge} is 12000x12000, 144,000,000 pixels, more than the 16,777,216 pixels" in err, err


def test_mixed_sizes_and_non_square_images_are_refused_before_any_image_is_decoded(tmp_path, monkeypatch):
    monkeypatch.setattr(images_module, "read_image", lambda *a: pytest.fail("an image was decoded"))
    root = write_folder(tmp_path / "mixed", sizes=[(4, 4), (8, 8), (4, 4), (4, 4)], mode="L")
    with pytest.raises(ValueError, match=r"^images of mixed sizes: 4x4 \(dog/003.png\), 8x8 \(dog/001.png\); give"):
        load_images.__wrapped__(str(root))
    root = write_folder(tmp_path / "wide", sizes=[(6, 3)] * 4, mode="L")
    with pytest.raises(ValueError, match=r"^cat/000.png in .* is 6x3, not square; give --image-size N"):
        load_images.__wrapped__(str(root))


@pytest.mark.parametrize(
    "size, message",
    [
        (100000, "makes 2,500,000,000 patches an image"),  # was RuntimeError "can't allocate", exit 1
        (4096, "makes 4,194,304 patches an image"),  # was 6-10 GB of memory
        (1024, "makes 262,144 patches an image"),  # ran for minutes and ignored SIGTERM
    ],
)
def test_an_image_size_past_the_patch_limit_is_refused_in_one_line(run_cli, size, message):
    code, _, err = run_cli("train", *TINY_IMAGE, "--image-size", size)
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert "more than 4,096 (64x64); use image_size 2 to 128 in steps of 2, or a larger patch_size" in err, err


def test_image_size_may_reach_the_patch_limit_in_larger_patches():
    assert image_tokens(replace(TINY_VIT, image_size=128, patch_size=2)) == 4096
    assert replace(TINY_VIT, image_size=1024, patch_size=16).image_size == 1024  # SAM's ViT
    with pytest.raises(ValueError, match="use image_size 16 to 1024 in steps of 16"):
        replace(TINY_VIT, image_size=1040, patch_size=16)


def test_an_image_set_that_would_not_fit_in_memory_is_refused_before_it_is_resized(run_cli, monkeypatch):
    monkeypatch.setattr("ffnlab._util.machine.machine_memory", lambda device: 1 << 30)  # a 1 GiB machine
    code, _, err = run_cli("train", *TINY_IMAGE, "--image-size", 256, "--patch-size", 4)
    assert code == 2 and err.count("\n") == 1, err
    assert "1,797 images of 1 x 256x256 pixels (digits) need at least 1.3 GiB, more than the 1.0 GiB here" in err


@pytest.mark.parametrize(
    "make, kind",
    [
        (
            lambda path: path.symlink_to(path.parent / "gone.png"),
            "is a symbolic link to .*gone.png, which does not exist",
        ),
        (lambda path: path.mkdir(), "is a folder"),
        (lambda path: os.mkfifo(path), r"is a FIFO \(a named pipe\), which may block for ever"),
        (
            lambda path: path.symlink_to("/dev/zero"),
            r"is a character device, which may never end \(a link to /dev/zero\)",
        ),
    ],
)
def test_an_image_entry_that_is_no_regular_file_is_refused_not_skipped(tmp_path, run_cli, make, kind):
    root = write_folder(tmp_path / "images")
    make(root / "dog" / "004.png")
    code, _, err = run_cli("train", "--task", "image", "--data", root, *TINY_MODEL, "--steps", 1)
    assert code == 2 and err.count("\n") == 1, err
    assert re.search(f"the image {root}/dog/004.png {kind}; give a regular file", err), err
