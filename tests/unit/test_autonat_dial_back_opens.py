"""The AutoNAT server's bare dial-back connection takes a few of the client's stream opens (its
identify), each reset, and aborts the connection past them: unbounded, a flood of opens there
held the node's loop for seconds (hostile review of c3a609a)."""

from __future__ import annotations

from lattica.actors.nat.autonat import _DIAL_BACK_OPENS, _DialBackOpens


class _Conn:
    def __init__(self) -> None:
        self.aborted: list[str] = []

    @property
    def is_closed(self) -> bool:
        return bool(self.aborted)

    def abort(self, reason: str) -> None:
        self.aborted.append(reason)


class _Stream:
    def __init__(self) -> None:
        self.was_reset = False

    def reset(self) -> None:
        self.was_reset = True


def test_a_metered_connection_grants_a_few_opens_then_aborts() -> None:
    conn = _Conn()
    opens = _DialBackOpens(conn)  # type: ignore[arg-type]
    opens.metered = True
    assert opens.gate(32) == (_DIAL_BACK_OPENS, 0.0)  # the mux asks for 32 at a time
    assert not conn.aborted
    s = _Stream()
    opens.refuse(s)  # (counted by the gate already)
    assert s.was_reset and not conn.aborted
    granted, _ = opens.gate(32)
    assert granted == 0 and len(conn.aborted) == 1
    opens.gate(32)
    assert len(conn.aborted) == 1  # (aborted once)


def test_an_unmetered_connection_counts_opens_as_they_come() -> None:
    conn = _Conn()
    opens = _DialBackOpens(conn)  # type: ignore[arg-type]  # (QUIC: the transport cannot meter)
    streams = [_Stream() for _ in range(_DIAL_BACK_OPENS)]
    for s in streams:
        opens.refuse(s)
    assert all(s.was_reset for s in streams) and not conn.aborted
    opens.refuse(_Stream())
    assert conn.aborted == ["the peer opened too many streams on a dial-back connection"]
