"""One training run: its config, the training loop, its monitors and checkpoints; its data is ffnlab.data's."""
