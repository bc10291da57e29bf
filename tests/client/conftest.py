import pytest

from server_process import Server


@pytest.fixture(scope="module")
def server():
    """One praxis-server per test module."""
    s = Server()
    yield s
    s.stop()
