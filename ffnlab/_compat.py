"""Old module names still import, with a DeprecationWarning, until REMOVED_IN (CHANGELOG.md): the flat names
before 0.2 (`ffnlab.train`, `ffnlab.sweep`, ...) and the data modules that left run/ for data/
(`ffnlab.run.data`, `ffnlab.run.tokenizer`, ...)."""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Callable, Sequence

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
    # "data" (the corpus module) is the package ffnlab.data now: `moved_names` answers its old names
    "tokenizer": "data.tokenizer",
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
    "run.data": "data.corpus",
    "run.tokenizer": "data.tokenizer",
    "run.pairs": "data.pairs",
    "run.tagging": "data.tagging",
    "run.images": "data.images",
}


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers `import ffnlab.<old>` with the module's new home."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        old = fullname.removeprefix("ffnlab.")
        if fullname.startswith("ffnlab.") and old in MOVED:
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # a placeholder; exec_module swaps in the real module

    def exec_module(self, module: types.ModuleType) -> None:
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


def moved_names(package: str, module: str) -> Callable[[str], object]:
    """A module `__getattr__` for a package that took the name of an older module: the names of that module,
    now `module`, still resolve through the package, with a DeprecationWarning; its submodules stay its own."""

    def getattr_(name: str) -> object:
        # NOTE: `from package import sub` asks here first; an AttributeError lets the import system load the submodule
        if not name.startswith("__") and importlib.util.find_spec(f"{package}.{name}") is None:
            old = importlib.import_module(module)
            if hasattr(old, name):
                warnings.warn(
                    f"{package}.{name} moved to {module}.{name}; import it from there (the old name goes in "
                    f"ffnlab {REMOVED_IN})",
                    DeprecationWarning,
                    stacklevel=2,
                )
                return getattr(old, name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return getattr_
