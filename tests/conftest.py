import shutil
import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
warnings.filterwarnings("ignore", message="transformer_engine module not found")


def pytest_collection_modifyitems(config, items):
    import torch

    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m gpu` on the GPU machine)")
    skip_dot = pytest.mark.skip(reason="needs Graphviz's dot on PATH (apt-get install graphviz)")
    has_gpu = torch.cuda.is_available()
    has_dot = shutil.which("dot") is not None
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(skip_gpu)
        if "dot" in item.keywords and not has_dot:
            item.add_marker(skip_dot)
