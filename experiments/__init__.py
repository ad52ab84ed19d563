"""Measurements outside `fairserve bench`: run from the repository root, see experiments/README.md."""
