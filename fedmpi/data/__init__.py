"""Data sources, partitions, the server's set and their statistics (docs/explanation/design.md §4 `data/*`)."""

from fedmpi.data.dataset import Dataset
from fedmpi.data.load import load_dataset

__all__ = ["Dataset", "load_dataset"]
