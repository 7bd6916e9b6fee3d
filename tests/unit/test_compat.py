"""pika's version range, and the private pika hooks wire.py, inbound.py and links.py use."""

from __future__ import annotations

import inspect

import pika
import pika.channel
import pika.connection
import pika.frame
import pika.spec
import pytest
from pika.adapters.utils import io_services_utils

from rmq_spark import compat


@pytest.mark.parametrize("version", ["1.4.4", "1.4.5", "1.4.10"])
def test_supported_pika_versions(version: str) -> None:
    assert compat.pika_problem(version) is None


@pytest.mark.parametrize("version", ["1.3.2", "1.4.3", "1.5.0", "1.5.0b1", "2.0.0", "dev"])
def test_other_pika_versions_are_refused_naming_both(version: str) -> None:
    problem = compat.pika_problem(version)
    assert problem is not None
    assert f"pika {version} is installed" in problem
    assert "pika>=1.4.4,<1.5" in problem


def test_a_missing_pika_is_named() -> None:
    assert compat.pika_problem(None) == "pika is not installed"


def test_the_installed_pika_is_supported() -> None:
    assert compat.installed_version("pika") == pika.__version__
    compat.check_pika()


def test_the_private_pika_hooks_exist() -> None:
    """Every private name wire.py, inbound.py and links.py replace, call or read."""
    # wire.py: property decoding and the transport's write loop
    assert pika.spec.props[pika.spec.BasicProperties.INDEX] is not None
    assert callable(pika.frame.decode_frame)
    assert callable(pika.frame.Header.marshal)
    transport = io_services_utils._AsyncPlaintextTransport
    assert callable(transport._produce)
    assert callable(transport._sigint_safe_send)
    for name in ("_MAX_RECV_BYTES", "_MAX_CONSUME_BYTES"):
        assert isinstance(getattr(io_services_utils._AsyncTransportBase, name), int)
    base_init = inspect.getsource(io_services_utils._AsyncTransportBase.__init__)
    for attribute in ("self._tx_buffers", "self._tx_buffered_byte_count", "self._sock"):
        assert attribute in base_init
    # inbound.py: the connection's inbound bytes and frames, the channel's consumers
    connection = pika.connection.Connection
    assert callable(connection._on_data_available)
    assert callable(connection._process_frame)
    assert "self._frame_buffer" in inspect.getsource(connection)
    channel_init = inspect.getsource(pika.channel.Channel.__init__)
    for attribute in ("self._cancelled", "self._consumers", "self._consumers_with_noack"):
        assert attribute in channel_init
    assert callable(pika.channel.Channel._on_deliver)
    # links.py: a batch of publishes handed to the output buffer as one chunk, its
    # bodies cut at the connection's frame size
    assert callable(connection._output_marshaled_frames)
    assert "self._body_max_length" in inspect.getsource(connection)
