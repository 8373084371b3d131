"""The run-folder trainer: typed config, the training loop (seeded, checkpointed, resumable), rule comparison."""
from .config import TrainConfig
from .loop import build, load_config, run_epoch, train

__all__ = ["TrainConfig", "build", "load_config", "run_epoch", "train"]
