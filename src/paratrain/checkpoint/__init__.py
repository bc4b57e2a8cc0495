"""Portable, crash-safe checkpoints: the store, the manifest, safe readers of foreign formats."""
