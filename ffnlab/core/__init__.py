"""The core: activations, FFN variants, the Transformer, memory accounting and fused kernels.

Imports nothing from the layers above it (tools, run, study, cli); tests/test_layers.py checks.
"""
