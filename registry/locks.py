"""Locks between writers that reuse a stored artifact and the garbage collector that deletes it.

Registering a version stores (or finds) its artifact in S3 first and writes the version row after;
between the two the object is referenced by nothing in the database. The writer holds a shared
PostgreSQL advisory lock on the object's key across both steps; the collector deletes a key only
while holding the exclusive lock on it, after checking again that no live version references it.
So either the collector deletes first and the writer finds the object gone and uploads it again,
or the writer's row is committed before the collector looks. Other databases (SQLite, local use
only) have no advisory locks: there the collector's grace period is the only defence.
"""

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection


def _lock_id(key: str) -> int:
    """A signed 64-bit advisory lock id for an object key (collisions only make the collector wait)."""
    digest = hashlib.sha256(f"modelyard-artifact:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _advisory_locks() -> bool:
    return connection.vendor == "postgresql"


@contextmanager
def artifact_in_use(key: str) -> Iterator[None]:
    """Hold ``key`` against garbage collection for the duration of the block (shared; writers never wait
    for each other, only for a collector deleting that very key). Session-level: it spans transactions."""
    if not _advisory_locks():
        yield
        return
    lock = _lock_id(key)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock_shared(%s)", [lock])
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock_shared(%s)", [lock])


@contextmanager
def artifact_for_deletion(key: str) -> Iterator[bool]:
    """Try to take ``key`` exclusively for deletion without waiting.

    Yields:
        True when no writer holds it (the caller may check references and delete), False when
        one does (the caller must keep the object). Always True without advisory locks.
    """
    if not _advisory_locks():
        yield True
        return
    lock = _lock_id(key)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [lock])
        taken = cursor.fetchone()[0]
    try:
        yield taken
    finally:
        if taken:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [lock])
