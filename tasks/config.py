"""The composed config every task receives (a plain dict), as validated settings."""

from __future__ import annotations

from typing import Any

from mage.settings import Settings


def settings_of(config: dict[str, Any]) -> Settings:
    return Settings.from_config(config)
