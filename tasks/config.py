"""The composed config every task receives (a plain dict), as validated settings."""

from __future__ import annotations

from typing import Any

from mage.settings import Settings


def settings_of(config: dict[str, Any]) -> Settings:
    """The task's settings. On a Ray worker the task first enters the driver's working
    directory (the runner names it), so the config's relative paths mean the same files."""
    if (config.get("flow") or {}).get("runner") == "ray":
        from tasks.ray_workers import enter_project_dir

        enter_project_dir()
    return Settings.from_config(config)
