"""Files over one S3 object for archive readers: by ranged GETs (seekable), or one forward stream (hashed)."""

from __future__ import annotations

import hashlib
import io
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from registry.storage.errors import CHUNK_BYTES, StorageError, _wrap

if TYPE_CHECKING:
    from registry.storage import ArtifactStore


class _ObjectFile(io.RawIOBase):
    """A read-only raw file over the S3 object ``key`` of ``size`` bytes: the position a subclass reads at."""

    def __init__(self, key: str, size: int):
        super().__init__()
        self._key, self._size = key, size
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise OSError(f"cannot seek before the start of {self._key}")
        self._position = base + offset
        return self._position



class RangedObjectReader(_ObjectFile):
    """A seekable raw file over one S3 object that fetches what is read by ranged GETs (RFC 9110 ``Range``).

    A read that misses the blocks already fetched makes one GET of at least ``READAHEAD`` bytes,
    reaching back from the end of the object when the read is near it, so that a zip's end of
    central directory, its zip64 locator and a small central directory come in one request, as do a
    tar's last header and end-of-archive marker. The last ``BLOCKS`` blocks are kept, so that a
    format check that reads the head, a seek to the end and a seek back cost no second request.
    Memory stays at ``BLOCKS`` blocks of ``READAHEAD`` bytes, or of the largest single read.

    A failed request raises ``StorageError``, not ``OSError``: archive readers turn ``OSError`` into
    "corrupt archive", but an unreachable store says nothing about the archive, and a retry may help.

    Attributes:
        requests: ranged GETs made so far.
        bytes_read: bytes received so far.
    """

    READAHEAD = 64 * 1024
    BLOCKS = 4

    def __init__(self, store: ArtifactStore, key: str, size: int, readahead: int = READAHEAD):
        super().__init__(key, size)
        self._store = store
        self._readahead = readahead
        self._blocks: dict[int, bytes] = {}  # start offset -> bytes, oldest first
        self._lock = threading.Lock()  # prefetch() fills blocks from several threads
        self.requests = 0
        self.bytes_read = 0

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        want = max(0, min(len(view), self._size - self._position))
        done = 0
        while done < want:
            start, block = self._block_at(self._position, want - done)
            offset = self._position - start
            count = min(want - done, len(block) - offset)
            view[done : done + count] = block[offset : offset + count]
            done += count
            self._position += count
        return done

    def prefetch(self, positions: list[int]) -> None:
        """Fetch the blocks at ``positions`` (byte offsets) now, concurrently, one thread each.

        Raises:
            StorageError: S3 failed; retrying may help.
        """
        wanted = sorted({min(p, max(0, self._size - self._readahead)) for p in positions if 0 <= p < self._size})
        with ThreadPoolExecutor(max(1, len(wanted)), thread_name_prefix="s3-range") as pool:
            for future in [pool.submit(self._block_at, p, 1) for p in wanted]:
                future.result()

    def _block_at(self, position: int, wanted: int) -> tuple[int, bytes]:
        for start, block in list(self._blocks.items()):
            if start <= position < start + len(block):
                return start, block
        length = max(self._readahead, wanted)
        start = min(position, max(0, self._size - length))
        end = min(self._size, max(start + length, position + wanted))
        try:
            answer = self._store.client.get_object(Bucket=self._store.bucket, Key=self._key,
                                                   Range=f"bytes={start}-{end - 1}")
            with closing(answer["Body"]) as body:
                block = body.read()
        except (BotoCoreError, ClientError) as exc:
            raise _wrap(exc, f"read {self._key} at byte {start}") from exc
        if len(block) != end - start:
            raise StorageError(f"S3 sent {len(block)} bytes of {self._key} for a range of {end - start}",
                               retryable=True)
        with self._lock:
            self.requests += 1
            self.bytes_read += len(block)
            self._blocks[start] = block
            while len(self._blocks) > self.BLOCKS:
                del self._blocks[next(iter(self._blocks))]
        return start, block


class StreamedObjectReader(_ObjectFile):
    """One GET of an S3 object as a file that can only move forward, hashing each byte once (SHA-256).

    A decompressor reading a ``.tar.gz`` front to back needs nothing more. ``seek`` forward skips
    (reads, hashes and drops) the bytes in between; ``seek`` back is possible only into the first
    ``HEAD_BYTES``, kept so that a format check may read the head and rewind; anywhere else it
    raises ``OSError``. Memory stays at the head plus what the caller asks for at once.

    Attributes:
        digest: ``hashlib.sha256`` of every byte received so far.
        bytes_read: how many bytes were received so far.
    """

    HEAD_BYTES = 64 * 1024

    def __init__(self, body, key: str, size: int):
        super().__init__(key, size)
        self._body = body
        self._head = bytearray()
        self.digest = hashlib.sha256()
        self.bytes_read = 0

    def _pull(self, count: int) -> bytes:
        try:
            data = self._body.read(count)
        except (BotoCoreError, ClientError) as exc:
            raise _wrap(exc, f"read {self._key}") from exc
        if len(self._head) < self.HEAD_BYTES:
            self._head += data[: self.HEAD_BYTES - len(self._head)]
        self.digest.update(data)
        self.bytes_read += len(data)
        return data

    def readinto(self, buffer) -> int:
        if self._position < self.bytes_read:
            if self._position >= len(self._head):
                raise OSError(f"cannot seek back in the stream of {self._key}")
            data = self._head[self._position : self._position + len(buffer)]
        else:
            while self.bytes_read < self._position:
                if not self._pull(min(CHUNK_BYTES, self._position - self.bytes_read)):
                    return 0
            data = self._pull(len(buffer))
        buffer[: len(data)] = data
        self._position += len(data)
        return len(data)

    def drain(self) -> None:
        """Read the rest of the object, so that ``digest`` and ``bytes_read`` cover all of it."""
        while self._pull(CHUNK_BYTES):
            pass
        self._position = self.bytes_read

    def close(self) -> None:
        self._body.close()
        super().close()
