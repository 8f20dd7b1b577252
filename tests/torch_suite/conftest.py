import os
import sys

import pytest

# run_suite / compare / suite_cases are imported from this folder.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "torch_suite: runs PyTorch's distributed test suite (minutes); "
        "deselect with -m 'not torch_suite'",
    )
    config.addinivalue_line(
        "markers",
        "torch_suite_long: the long selection (outside CI); select with -m torch_suite_long",
    )
