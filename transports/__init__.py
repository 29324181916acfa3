"""Byte movers: TCP + Noise + mux, QUIC, and the in-memory transport (installed as lattica.transports)."""
