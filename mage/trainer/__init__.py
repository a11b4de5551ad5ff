"""The trainer: PPO updates with LoRA or full fine-tuning, micro-batching, checkpoints."""
