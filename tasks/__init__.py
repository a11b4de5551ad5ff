"""Prefect tasks: thin wrappers over :mod:`mage` with cache policies and retries."""
