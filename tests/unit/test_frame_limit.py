"""How big a Noise frame a connection seals, from what the kernel says of the path."""

import socket
import sys

import pytest

from lattica.transports.muxed import FRAME_TIME, frame_limit
from lattica.transports.noise import MAX_PLAINTEXT
from lattica.transports.tcpinfo import tcp_info


def test_without_a_pacing_rate_frames_are_whole():
    assert frame_limit(None, 1448) == MAX_PLAINTEXT
    assert frame_limit(0, None) == MAX_PLAINTEXT


def test_a_fast_path_keeps_whole_frames():
    assert frame_limit(1e9, 65483) == MAX_PLAINTEXT  # loopback: a millisecond is far more than 64 KiB


def test_a_slow_path_gets_a_millisecond_of_bytes_but_never_less_than_a_segment():
    assert frame_limit(8.9e6, 1448) == int(8.9e6 * FRAME_TIME)
    assert frame_limit(325e3, 1448) == 1448 - 18  # (one segment, less Noise's length and tag)
    assert frame_limit(325e3, None) == 512
    assert frame_limit(1, 0) == 512


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="TCP_INFO's layout read here is Linux's")
def test_tcp_info_reads_the_segment_size_and_the_pacing_rate_of_a_real_socket():
    with socket.create_server(("127.0.0.1", 0)) as srv:
        with socket.create_connection(srv.getsockname()) as c:
            a, _ = srv.accept()
            with a:
                c.sendall(b"x" * 100_000)
                got = 0
                while got < 100_000:
                    got += len(a.recv(1 << 20))
                info = tcp_info(c)
    assert info is not None and info["bytes_sent"] >= 100_000
    assert 500 < info["mss"] <= 65535
    assert info.get("pacing_rate", 1) > 0  # (absent only where the kernel does not pace)
