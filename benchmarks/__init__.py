"""Reproducible performance measurements that print JSON (run from the repository root)."""
