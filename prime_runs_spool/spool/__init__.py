"""The spool: the on-disk format and the files (docs/spool-format.md).

``format`` is the bytes of one line and the record types, ``layout`` every path and file
name, ``writer`` durable group-committed appends (``commit``: the batch and how its
members wake), ``reader`` streaming verified reads, ``verify`` the verdict on a spool.
Imports nothing above itself: a spool is readable with this folder and ``errors`` alone.
"""
