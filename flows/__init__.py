"""Prefect flows chaining the cached tasks of `tasks/` (one module per pipeline stage)."""
