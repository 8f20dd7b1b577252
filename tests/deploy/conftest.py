"""pytest configuration for the deploy/ checks (select them with -m deploy)."""

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "deploy: offline checks of deploy/ (KubeRay manifests, Dockerfile); seconds")
