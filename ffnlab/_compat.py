"""Old flat module names (`ffnlab.train`, `ffnlab.sweep`, ...) still import, with a DeprecationWarning,
until REMOVED_IN (CHANGELOG.md)."""

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings

REMOVED_IN = "0.4.0"
MOVED = {
    "activations": "core.activations",
    "ffn": "core.ffn",
    "model": "core.model",
    "memory": "core.memory",
    "kernels": "core.kernels",
    "files": "_util.files",
    "hf": "tools.hf",
    "export": "tools.export",
    "numerics": "tools.numerics",
    "bench": "tools.bench",
    "data": "run.data",
    "tokenizer": "run.tokenizer",
    "train": "run.train",
    "sweep": "study",
    "store": "study.store",
    "stats": "study.stats",
    "summary": "study.summary",
    "protocol": "study.protocol",
    "report": "study.report",
    "plots": "study.plots",
    "advise": "study.advise",
    "published": "study.published",
}


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers `import ffnlab.<old>` with the module's new home."""

    def find_spec(self, fullname: str, path=None, target=None):
        old = fullname.removeprefix("ffnlab.")
        if fullname.startswith("ffnlab.") and old in MOVED:
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec) -> None:
        return None  # a placeholder; exec_module swaps in the real module

    def exec_module(self, module) -> None:
        new = "ffnlab." + MOVED[module.__name__.removeprefix("ffnlab.")]
        warnings.warn(
            f"{module.__name__} moved to {new}; import it from there (the old name goes in ffnlab {REMOVED_IN})",
            DeprecationWarning,
            stacklevel=2,
        )
        # NOTE: the import system returns whatever sys.modules holds under the name once loading ends, so
        # the old name becomes an alias of the one real module (one TrainConfig class, not two copies).
        sys.modules[module.__name__] = importlib.import_module(new)


def install() -> None:
    if not any(isinstance(f, MovedModules) for f in sys.meta_path):
        sys.meta_path.append(MovedModules())
