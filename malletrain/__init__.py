"""malletrain: harvest transiently idle Slurm nodes for malleable DNN training."""
__version__ = "0.1.0"
