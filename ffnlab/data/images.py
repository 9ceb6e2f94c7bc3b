"""Images for task "image": a folder of class subfolders or scikit-learn's bundled 8x8 digits, split train/val/test.

`load_images(source, image_size, channels)` is the one entry point; `IMAGE_SOURCES` lists the names it knows
beside a folder. An `ImageSet` holds each split's pixels, scaled to [0, 1], and labels; `normalised(split)`
gives them as the model sees them, less the training split's per-channel mean and over its std.

- `digits` (offline): the 1,797 8x8 greyscale digits that scikit-learn ships (`sklearn.datasets.load_digits`,
  UCI's optical digits test set), 10 classes.
- a folder: one subfolder per class (`cat/001.png`; the subfolder's name is the class, in sorted order), images
  anywhere below it in a format Pillow reads (IMAGE_SUFFIXES; other files, hidden ones and subfolders without
  images are skipped).

Splits (seed-independent, so every seed and variant sees the same ones): within each class the images are
ranked by sha256 of their name (a folder's: the path below the folder; digits': 'digits/<index>'), the first
max(1, round(10%)) go to val, as many to test, the rest to train; every class is in every split, so each needs
at least 3 images.

Sizes and channels: images are square, `image_size` pixels a side. With image_size given, an image of another
size is resized to it (bilinear, antialiased; a non-square image is stretched); with None all images must share
one square size. A folder's images become greyscale (channels 1) when all are, else RGB (3, alpha dropped),
unless `channels` says which; digits are greyscale, repeated for channels 3.

Bounds: a folder's sizes, modes and file kinds are read from the headers (Pillow decodes nothing on open) and
checked before any image is decoded: every entry with an image suffix must be a regular file (a FIFO, a device
or a dangling link is refused, not skipped), have at most MAX_IMAGE_PIXELS pixels, and, with image_size None,
share one square size; and the set as the run holds it must fit this machine's memory (`check_set_memory`).
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ffnlab._util.machine import check_memory
from ffnlab._util.reading import check_readable
from ffnlab.data.corpus import SPLITS, split_names

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
GREY_MODES = ("1", "L", "LA", "I", "I;16", "F")  # Pillow's modes without colour
MIN_PER_CLASS = 3  # one each for train, val and test
# NOTE: decoded to float32 RGB such an image is 200 MB; a 12-megapixel phone photo (4000x3000) fits, a larger
# one is refused from its header, before Pillow decodes it (a 12000x12000 PNG of 140 KB took 4.3 GB)
MAX_IMAGE_SIDE = 4096
MAX_IMAGE_PIXELS = MAX_IMAGE_SIDE**2
SET_COPIES = 3  # float32 copies of the sized set alive at once while it is stacked and split (`image_set`)
IMAGE_SOURCES = {
    "digits": "1,797 8x8 greyscale digits bundled with scikit-learn, 10 classes (image)",
}


@dataclass
class ImageSet:
    """Images of one source split train/val/test: pixels in [0, 1] (N, channels, size, size) and class ids."""

    name: str  # "digits" or the folder
    images: dict[str, torch.Tensor]  # split -> (N, channels, size, size) float32
    labels: dict[str, torch.Tensor]  # split -> (N,) int64, index into `classes`
    classes: list[str]
    meta: dict[str, Any] = field(default_factory=dict)  # source and split rule

    @property
    def channels(self) -> int:
        return self.images["train"].shape[1]

    @property
    def image_size(self) -> int:
        return self.images["train"].shape[-1]

    def mean_std(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-channel mean and std of the training split's pixels, (channels, 1, 1) each."""
        train = self.images["train"]
        mean = train.mean(dim=(0, 2, 3))
        std = train.std(dim=(0, 2, 3)).clamp_min(1e-6)  # NOTE: a blank channel would divide by zero
        return mean[:, None, None], std[:, None, None]

    def normalised(self, split: str) -> torch.Tensor:
        """`split`'s images less the training split's per-channel mean, over its std."""
        mean, std = self.mean_std()
        return (self.images[split] - mean) / std


class PixelInput:
    """The tokenizer slot of an image run (`ffnlab.data.load.load_data`): images are embedded from their
    pixels (ffnlab.core.model.PatchEmbed), so there is no vocabulary and no text to encode or decode."""

    kind = "pixels"
    vocab_size = 0

    def encode(self, text: str) -> list[int]:
        raise ValueError("task image reads pixels: there is no text to encode")

    def encode_array(self, text: str) -> np.ndarray:
        raise ValueError("task image reads pixels: there is no text to encode")

    def decode(self, ids: Any) -> str:
        raise ValueError("task image reads pixels: its inputs are images, not text")

    def state(self) -> dict[str, Any]:
        return {"kind": self.kind}


# ---- sizes and channels -------------------------------------------------------------------------


def fit_size(image: torch.Tensor, size: int | None, where: str) -> torch.Tensor:
    """A (channels, H, W) image at size x size: resized (bilinear, antialiased) when `size` is given and differs;
    with size None it must be square already (ValueError naming `where` otherwise)."""
    height, width = image.shape[-2:]
    if size is None:
        if height != width:
            raise ValueError(
                f"{where} is {width}x{height}, not square; give --image-size N to resize every image to NxN"
            )
        return image
    if (height, width) == (size, size):
        return image
    return F.interpolate(image[None], size=(size, size), mode="bilinear", antialias=True, align_corners=False)[0]


def one_size(shapes: list[tuple[int, int]], names: list[str]) -> None:
    """ValueError naming two images of different (height, width) `shapes`, unless all share one."""
    sizes = dict(zip(shapes, names))
    if len(sizes) > 1:
        shown = ", ".join(f"{w}x{h} ({name})" for (h, w), name in list(sizes.items())[:2])
        raise ValueError(f"images of mixed sizes: {shown}; give --image-size N to resize every image to NxN")


def check_set_memory(n_images: int, channels: int, size: int, where: str) -> None:
    """ValueError, before any image is decoded or resized, when `n_images` images of channels x size x size
    float32 pixels, SET_COPIES times over, need more memory than this machine has."""
    check_memory(
        SET_COPIES * n_images * channels * size * size * 4,
        "cpu",
        f"{n_images:,} images of {channels} x {size}x{size} pixels ({where})",
        "give a smaller --image-size",
    )


def ranked_splits(names: list[str], labels: list[int], classes: list[str], where: str) -> dict[str, list[int]]:
    """Indices per split: within each class, names ranked by sha256 (data.split_names: 10% val, 10% test, at
    least one each); ValueError naming a class with fewer than MIN_PER_CLASS images."""
    by_class: dict[int, list[str]] = {}
    for name, label in zip(names, labels):
        by_class.setdefault(label, []).append(name)
    index = {name: i for i, name in enumerate(names)}
    out: dict[str, list[int]] = {split: [] for split in SPLITS}
    for label in sorted(by_class):
        members = by_class[label]
        if len(members) < MIN_PER_CLASS:
            raise ValueError(
                f"{where}: class '{classes[label]}' has {len(members)} image(s); each class needs at least "
                f"{MIN_PER_CLASS} (one each for train, val and test)"
            )
        for split, chosen in split_names(members).items():
            out[split] += [index[name] for name in chosen]
    return {split: sorted(ix) for split, ix in out.items()}


def image_set(
    name: str,
    images: list[torch.Tensor],
    names: list[str],
    labels: list[int],
    classes: list[str],
    image_size: int | None,
    meta: dict[str, Any],
) -> ImageSet:
    """An ImageSet from (channels, H, W) images with their names and class ids: sized, split by
    `ranked_splits`, stacked."""
    if image_size is None:
        one_size([(image.shape[-2], image.shape[-1]) for image in images], names)
    sized = [fit_size(image, image_size, f"{name} in {meta['source']}") for image, name in zip(images, names)]
    splits = ranked_splits(names, labels, classes, name)
    stacked = torch.stack(sized)
    targets = torch.tensor(labels, dtype=torch.long)
    meta = {
        **meta,
        "split_rule": "per class, images ranked by sha256 of their name: 10% val, 10% test (at least 1 each)",
        "images": {split: len(ix) for split, ix in splits.items()},
    }
    return ImageSet(
        name,
        {split: stacked[ix] for split, ix in splits.items()},
        {split: targets[ix] for split, ix in splits.items()},
        classes,
        meta,
    )


# ---- sources ------------------------------------------------------------------------------------


def load_digits(image_size: int | None, channels: int | None) -> ImageSet:
    """scikit-learn's bundled 8x8 digits (no download): 16 grey levels scaled to [0, 1]."""
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError:
        raise ValueError(
            "'digits' is scikit-learn's bundled image set: pip install scikit-learn, or give an image folder"
        ) from None
    import sklearn

    bunch = sklearn_digits()
    check_set_memory(len(bunch.images), channels or 1, image_size or 8, "digits")
    pixels = torch.from_numpy(np.asarray(bunch.images, dtype=np.float32) / 16.0)[:, None]  # (N, 1, 8, 8)
    if channels == 3:
        pixels = pixels.expand(-1, 3, -1, -1)
    names = [f"digits/{i}" for i in range(len(pixels))]
    classes = [str(c) for c in bunch.target_names]
    meta = {"source": f"scikit-learn {sklearn.__version__} load_digits"}
    return image_set("digits", list(pixels), names, [int(t) for t in bunch.target], classes, image_size, meta)


def unreadable(path: Path, error: Exception) -> ValueError:
    """The one-line error for an image file Pillow could not read, with the first line of its reason."""
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return ValueError(f"{path} is not a readable image ({reason})")


def read_image(path: Path, channels: int) -> torch.Tensor:
    """One image file as (channels, H, W) in [0, 1]; ValueError naming the file if Pillow cannot read it."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            image.load()  # decode now: a truncated file fails here, not later
            converted = image.convert("L" if channels == 1 else "RGB")
    except Exception as e:  # Pillow raises several kinds (UnidentifiedImageError, OSError, SyntaxError)
        raise unreadable(path, e) from None
    pixels = torch.from_numpy(np.asarray(converted, dtype=np.float32) / 255.0)
    return pixels[None] if channels == 1 else pixels.permute(2, 0, 1)  # (H, W[, 3]) -> (channels, H, W)


def image_files(folder: Path) -> list[Path]:
    """Entries with an image suffix below a class folder, sorted, whatever their kind (`load_folder` refuses a
    FIFO, a device or a dangling link among them instead of skipping it); hidden ones skipped."""
    return sorted(
        f
        for f in folder.rglob("*")
        if f.suffix.lower() in IMAGE_SUFFIXES and not any(part.startswith(".") for part in f.relative_to(folder).parts)
    )


@dataclass(frozen=True)
class ImageHeader:
    """What an image file's header says: its size and Pillow's mode, read without decoding its pixels."""

    width: int
    height: int
    mode: str


def read_header(path: Path) -> ImageHeader:
    """The header of one image file (`check_readable` first: a regular file); ValueError naming the file where
    Pillow cannot read it or it has more than MAX_IMAGE_PIXELS pixels."""
    from PIL import Image

    check_readable(path, "the image")
    too_large = (
        f"more than the {MAX_IMAGE_PIXELS:,} pixels ({MAX_IMAGE_SIDE}x{MAX_IMAGE_SIDE}) ffnlab decodes; shrink it first"
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # refused below, in one line
            with Image.open(path) as image:
                header = ImageHeader(image.width, image.height, image.mode)
    except Image.DecompressionBombError:  # Pillow's own limit, above ours
        raise ValueError(f"{path} has {too_large}") from None
    except Exception as e:  # as in read_image
        raise unreadable(path, e) from None
    if header.width * header.height > MAX_IMAGE_PIXELS:
        raise ValueError(
            f"{path} is {header.width}x{header.height}, {header.width * header.height:,} pixels, {too_large}"
        )
    return header


def check_headers(headers: list[ImageHeader], names: list[str], image_size: int | None, where: str) -> int:
    """The side every image will have: `image_size`, or with None the one square size all headers share
    (ValueError naming two sizes that differ, or a non-square image); nothing decoded."""
    if image_size is not None:
        return image_size
    one_size([(h.height, h.width) for h in headers], names)
    if headers[0].height != headers[0].width:
        raise ValueError(
            f"{names[0]} in {where} is {headers[0].width}x{headers[0].height}, not square; give --image-size N to "
            "resize every image to NxN"
        )
    return headers[0].height


def load_folder(root: Path, image_size: int | None, channels: int | None) -> ImageSet:
    """An image folder, one subfolder per class (module doc)."""
    folders = sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    files = {d.name: image_files(d) for d in folders}
    files = {name: paths for name, paths in files.items() if paths}
    if len(files) < 2:
        found = f"one class folder with images ('{next(iter(files))}')" if files else "no class folder with images"
        raise ValueError(
            f"{root} has {found}; task image needs at least two classes, each a subfolder of images "
            f"({', '.join(IMAGE_SUFFIXES)}), e.g. {root}/cat/001.png and {root}/dog/001.png"
        )
    classes = sorted(files)
    paths = [path for name in classes for path in files[name]]
    names = [path.relative_to(root).as_posix() for path in paths]
    meta = {"source": f"{len(paths)} images in {len(classes)} class folders under {root}"}
    headers = [read_header(path) for path in paths]  # every size and kind checked before any image is decoded
    size = check_headers(headers, names, image_size, meta["source"])
    channels = channels or (1 if all(h.mode in GREY_MODES for h in headers) else 3)
    check_set_memory(len(paths), channels, size, str(root))
    # each image sized as it is decoded: one full-size image in memory at a time
    images = [fit_size(read_image(path, channels), image_size, str(path)) for path in paths]
    labels = [i for i, name in enumerate(classes) for _ in files[name]]
    return image_set(str(root), images, names, labels, classes, image_size, meta)


@functools.lru_cache(maxsize=4)
def load_images(source: str, image_size: int | None = None, channels: int | None = None) -> ImageSet:
    """Images by name (IMAGE_SOURCES) or from a folder of class subfolders, sized and split (module doc);
    ValueError in one line for what cannot be read."""
    if source in IMAGE_SOURCES:
        return load_digits(image_size, channels)
    path = Path(source).expanduser()
    if source and path.is_dir():
        return load_folder(path, image_size, channels)
    what = "is a file, not a folder" if path.is_file() else "is no image folder"
    raise ValueError(
        f"task image reads a folder of class subfolders (cat/001.png, dog/001.png) or "
        f"{', '.join(repr(n) for n in IMAGE_SOURCES)}; '{source}' {what}"
    )
