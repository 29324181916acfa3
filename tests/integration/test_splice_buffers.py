"""A spliced circuit's copy buffers: small while traffic is small, grown for bulk, bytes intact."""

import asyncio
import hashlib
import os

from lattica.transports.splice import _CHUNK, _FIRST, Splice


class _Hand(asyncio.Protocol):
    def __init__(self, splice: Splice) -> None:
        self.splice = splice

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.splice.attach(transport)  # type: ignore[arg-type]


def test_copy_buffers_start_small_and_grow_only_in_the_direction_that_carries_bulk():
    async def main():
        splice = Splice()
        server = await asyncio.get_running_loop().create_server(lambda: _Hand(splice), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        ra, wa = await asyncio.open_connection("127.0.0.1", port)
        rb, wb = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(splice.wait_joined(), 5)
        a_to_b = next(p for p in splice._pipes if p.src.getpeername() == wa.get_extra_info("sockname"))
        b_to_a = next(p for p in splice._pipes if p is not a_to_b)

        for i in range(50):  # request/response sized traffic both ways
            wa.write(b"q%03d" % i)
            assert await rb.readexactly(4) == b"q%03d" % i
            wb.write(b"r%03d" % i)
            assert await ra.readexactly(4) == b"r%03d" % i
        assert len(a_to_b.view) == len(b_to_a.view) == _FIRST

        bulk = os.urandom(8 << 20)
        wa.write(bulk)
        got = await rb.readexactly(len(bulk))
        assert hashlib.sha256(got).digest() == hashlib.sha256(bulk).digest()
        assert len(a_to_b.view) == _CHUNK  # grew while reads filled it
        assert len(b_to_a.view) == _FIRST  # the quiet direction did not
        for w in (wa, wb):
            w.close()
        splice.close("test over", clean=True)
        server.close()

    asyncio.run(main())
