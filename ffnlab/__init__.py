"""ffnlab: choose a Transformer's feed-forward activation by measuring it."""

from ffnlab import _compat
from ffnlab.core.activations import ACTIVATIONS, get_activation
from ffnlab.core.ffn import FFNS, build_ffn, ffn_hidden_dim, ffn_stats
from ffnlab.core.model import ModelConfig, Transformer

__version__ = "0.2.0"
_compat.install()
__all__ = [
    "ACTIVATIONS",
    "FFNS",
    "ModelConfig",
    "Transformer",
    "build_ffn",
    "ffn_hidden_dim",
    "ffn_stats",
    "get_activation",
]
