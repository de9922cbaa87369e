"""Generators the study builds its own inputs with: test checkpoints, the tiny model, GSM8K-format data."""
