"""One training run: data, tokenizers, the training loop, its monitors and checkpoints."""
