"""What every NAT-lab test needs: the lab's tools (root, ip netns and nft)."""

import pytest

from .lab import Lab


@pytest.fixture(scope="module")
def need_lab() -> None:
    ok, why = Lab.available()
    if not ok:
        pytest.skip(why)  # needs root, ip netns and nft: CI has them (.ci/run installs them)
