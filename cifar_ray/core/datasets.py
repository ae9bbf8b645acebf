"""What the CLI needs to know about the datasets without importing torch (`data` imports it: 1.6 s
of `cifar-ray --help` before this module): their sizes (the error for data it cannot use is errors.DataError)."""

from __future__ import annotations

# (train, test) images of the full dataset; synthetic mirrors CIFAR-10 so subsets mean the same on both
DATASET_SIZES = {"cifar10": (50_000, 10_000), "synthetic": (50_000, 10_000)}


def test_images(dataset: str, test_subset: int) -> int:
    """The images a trial is tested on: the first test_subset of the test set (0 = all of it)."""
    full = DATASET_SIZES[dataset][1]
    return min(test_subset or full, full)
