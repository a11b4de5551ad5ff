"""Flow ``prepare_model``: the base model on this machine (the tiny preset built, or a hub model fetched)."""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from flows.common import logger, settings_for
from mage import io
from mage.config.sections import SPLITS
from tasks.caching import configured
from tasks.model import prepare_model as prepare_model_task
from tasks.refs import FileRef


@flow(name="prepare_model")
def prepare_model(overrides: list[str] | None = None, config_file: str | None = None) -> FileRef:
    """Build the ``tiny`` preset (tokenizer, seeded Qwen2-architecture model, behaviour-cloning
    warm start) or fetch a hub model into ``model.local_dir``; reference its directory."""
    settings = settings_for(overrides, config_file)
    model = configured(prepare_model_task, settings.flow)(settings)
    preset = Path(model.path) / "preset.json"
    if preset.is_file():  # the tiny preset describes how its warm start plays
        remedy = f"delete {model.path} and re-run prepare_model: the preset is rebuilt"
        check = io.read_json(preset, remedy).get("warm_start") or {}
        for split in SPLITS:
            pooled = (check.get(split) or {}).get("all")
            if pooled:
                logger().info(
                    f"warm start against the {split} opponents: final-episode win rate {pooled['final_win_rate']:.2f} "
                    f"(its ceiling {pooled['win_ceiling_final']:.2f}), draw rate {pooled['final_draw_rate']:.2f}, "
                    f"invalid rate {pooled['invalid_rate']:.3f} ({pooled['meta_episodes']} meta-episodes)")
    logger().info(f"model ready: {model.path} (sha256 {model.sha256[:12]})")
    return model
