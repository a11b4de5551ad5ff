"""The trainer: PPO updates with LoRA or full fine-tuning, checkpoints, the training loop."""

from mage.train.config import LoraSettings, TrainConfig

__all__ = ["LoraSettings", "TrainConfig"]
