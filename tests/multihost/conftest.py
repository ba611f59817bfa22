"""One multi-host cluster (control plane + three agents in network namespaces) for the whole
package; skipped with the reason when this machine does not allow `ip netns add`. Every test
leaves it idle (live jobs cancelled, no GPU allocated) for the next."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

from tests.multihost.cluster import MultiHost, idle
from tests.multihost.netns import probe

TORCH_MISSING = "PyTorch is not installed: run `bash scripts/torch.sh` (CI does, through scripts/test.sh)"


@pytest.fixture(scope="session")
def multihost(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiHost]:
    why = probe()
    if why is not None:
        pytest.skip(f"multi-host tests need network namespaces: {why}")
    mh = MultiHost(tmp_path_factory.mktemp("mh"))
    try:
        mh.start()
        yield mh
    finally:
        left = mh.stop()
    # the agents kill their workers when stopped: nothing of ours may outlive them
    assert not left, f"processes left in the namespaces after the agents and server stopped: {left}"


@pytest.fixture
def cluster(multihost: MultiHost) -> Iterator[MultiHost]:
    idle(multihost)
    yield multihost
    idle(multihost)


@pytest.fixture
def torch_installed() -> None:
    if importlib.util.find_spec("torch") is None:
        pytest.skip(TORCH_MISSING)
