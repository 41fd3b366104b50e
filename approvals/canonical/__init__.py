"""Strict JSON in, canonical bytes out.

Raw bodies are parsed strictly (``parsing``), arguments are validated against the tool's
JSON Schema (``schema``, with money in ``money``), and the action is serialized with
RFC 8785 and digested with SHA-256 (``form``). Text a reviewer must read correctly is
examined in ``confusables``.
"""
