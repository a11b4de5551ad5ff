"""Sokoban: one-player box pushing on small generated levels."""

from mage.games.sokoban.game import Sokoban, SokobanEpisode
from mage.games.sokoban.generator import generate_level
from mage.games.sokoban.level import Level
from mage.games.sokoban.solver import solve

__all__ = ["Level", "Sokoban", "SokobanEpisode", "generate_level", "solve"]
