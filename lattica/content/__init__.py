"""The content plane: bytes named by their hash (CIDs), chunked into UnixFS objects, kept in a
blockstore and fetched Bitswap-style from every peer that holds them (docs/content.md)."""
