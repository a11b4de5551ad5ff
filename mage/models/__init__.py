"""Model presets: the locally built tiny model and the hub-loading path."""
