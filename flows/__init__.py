"""Prefect flows composing the tasks into the MAGE lifecycle."""
