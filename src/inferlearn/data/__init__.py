"""Datasets read from their original files: MNIST, Fashion-MNIST, CIFAR-10 (colour and grayscale), CIFAR-100,
Tiny ImageNet, digits; and the training loop's input transforms (:mod:`inferlearn.data.transforms`)."""
from .datasets import DATASETS, Dataset, describe, fetch, load_dataset, locate, search_roots

__all__ = ["DATASETS", "Dataset", "describe", "fetch", "load_dataset", "locate", "search_roots"]
