"""A run's data: corpus reading, tokenizers, sentence pairs, tagged sentences, images, prepared tokens, and batches.

Imports only the core and _util, never run/, study/ or tools/ (tests/test_layers.py checks); the training
loop imports from here.
"""

from typing import TYPE_CHECKING

from ffnlab import _compat

if not TYPE_CHECKING:  # to a type checker this package's names are its submodules alone
    # before 0.2 `ffnlab.data` was the corpus module: `ffnlab.data.load_corpus` still resolves, with a warning
    __getattr__ = _compat.moved_names(__name__, "ffnlab.data.corpus")
