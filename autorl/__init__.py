"""AutoRL: post-train small language models with reinforcement learning under a time budget."""

__version__ = "0.1.0"
