"""The validated settings: the composed configuration (:mod:`mage.config`) checked whole before
any work, each section and the rules between them (:mod:`mage.settings.validate`), the
population's entries against their game (:mod:`mage.settings.entries`), and the reference that
``docs/configuration.md`` is generated from (:mod:`mage.settings.reference`)."""

from mage.settings.validate import Settings, SettingsError, held_out_settings, load_settings

__all__ = ["Settings", "SettingsError", "held_out_settings", "load_settings"]
