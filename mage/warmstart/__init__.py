"""Preparing the base model: the ``tiny`` preset built here (tokenizer, seeded model,
behaviour-cloning warm start: :mod:`mage.warmstart.preset`), or a hub model fetched into
``model.local_dir``. Loading a model (:mod:`mage.models.policy`) never builds or fetches:
it finds what this step left."""

from __future__ import annotations

import logging

from mage.models.policy import HUB_FILES, ModelNotPreparedError, model_source
from mage.settings import Settings
from mage.warmstart.preset import Say, build_differences, build_tiny, say_nothing

__all__ = ["build_tiny", "prepare_model"]

#: (model.path, differences) already warned about in this process.
_STALE_PRESETS_WARNED: set[tuple[str, str]] = set()


def prepare_model(settings: Settings, progress: bool = True, say: Say = say_nothing) -> str:
    """The base model's local directory, made available: where :func:`model_source` finds it,
    else the tiny preset built there or a hub model (``model.path`` is a hub id) fetched into
    ``model.local_dir`` (or the hub cache). Either way the result loads with ``from_pretrained``.
    ``say`` hears a build's or a fetch's stages, one line each (:func:`build_tiny`)."""
    model = settings.model
    try:
        found = model_source(settings)
    except ModelNotPreparedError:
        if model.build == "tiny":
            build_tiny(settings, progress=progress, say=say)
            return model.path
        from huggingface_hub import snapshot_download

        say(f"fetching {model.path} from the hub into {model.local_dir or 'the hub cache'}")
        return snapshot_download(model.path, local_dir=model.local_dir, allow_patterns=list(HUB_FILES))
    if model.build == "tiny" and (differences := build_differences(model.path, model.tiny)):
        # Kept, not rebuilt: a preset is also reused on purpose (one build for every game of a
        # smoke run, a preset copied in to skip its build). DVC's stage rebuilds on its own.
        changes = ", ".join(f"{key} {built!r} -> {asked!r}" for key, (built, asked) in differences.items())
        if (model.path, changes) not in _STALE_PRESETS_WARNED:  # the flows ask once per sub-flow
            _STALE_PRESETS_WARNED.add((model.path, changes))
            logging.getLogger(__name__).warning(
                f"{model.path}: the tiny preset there was built with other model.tiny settings ({changes}); "
                "it is used as it is. Remove the directory, or set model.path elsewhere, to build it anew.")
    return found
