"""Flow ``prepare_model``: the base model on this machine (the tiny preset built, or a hub model fetched)."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import flow

from flows.common import configured, logger, settings_for
from tasks import prepare_model as prepare_model_task
from tasks.refs import FileRef


@flow(name="prepare_model")
def prepare_model(overrides: list[str] | None = None, config_file: str | None = None) -> FileRef:
    """Build the ``tiny`` preset (tokenizer, seeded Qwen2-architecture model, behaviour-cloning
    warm start) or fetch a hub model into ``model.local_dir``; reference its directory."""
    settings = settings_for(overrides, config_file)
    model = configured(prepare_model_task, settings.flow)(settings.raw)
    preset = Path(model.path) / "preset.json"
    if preset.is_file():  # the tiny preset describes how its warm start plays
        logger().info(f"{model.path}: {json.dumps(json.loads(preset.read_text()).get('warm_start'))}")
    logger().info(f"model ready: {model.path} (sha256 {model.sha256[:12]})")
    return model
