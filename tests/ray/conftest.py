"""pytest configuration for the Ray cluster tests (select them with -m ray_cluster)."""

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "ray_cluster: brings up a local multi-node Ray cluster of emulated TPU hosts "
        "(tools/ray_cluster.sh); about a minute, network namespaces need root",
    )
    config.addinivalue_line(
        "markers",
        "ray_example: runs an examples/ray program on a local Ray cluster (outside CI for now)",
    )
