"""A worker's channel to the supervisor: framed, bounded, checked messages.

Each message of :mod:`.protocol` crosses a pipe as one frame: a header
(:data:`FRAME_MAGIC` and the payload's length) and the pickled message. The
worker writes whole frames (:class:`ChannelWriter`); the supervisor reads
without ever blocking (:class:`ChannelReader`: a non-blocking pipe, a few
MiB at a time), so a worker that sends half a frame, or a length header
announcing gigabytes, cannot stop the supervisor's loop, its deadline or
its signals. A header without the magic, a length above
:data:`MAX_FRAME_BYTES`, a payload that does not unpickle to a protocol
message, or a channel that ends inside a frame is a :class:`ChannelError`,
an error of the suite: nothing on a channel is dropped unread.
(multiprocessing's queue read a frame's whole announced length in one
blocking call, and raised ``UnpicklingError`` out of the supervisor.)
"""

from __future__ import annotations

import io
import os
import pickle
import queue
import struct

from ...cases import MAX_CASE_BYTES
from . import protocol

FRAME_MAGIC = b"c128"
HEADER = struct.Struct("!4sI")  # the magic, the payload's length in bytes
MAX_FRAME_BYTES = 2 * MAX_CASE_BYTES
"""The largest payload a frame may announce: a message holds at most one case."""
READ_LIMIT_BYTES = 4 << 20
"""The most one :meth:`ChannelReader.get_nowait` reads, so that a worker
flooding its channel cannot hold the supervisor's loop."""
ALLOWED_MODULES = ("c128a.", "collections")
"""Where the classes a frame may name live: the protocol's messages, the
cases and steps they carry, and plain containers."""


class ChannelError(Exception):
    """A worker's channel holds something that is not a frame of a protocol
    message: the channel cannot be read past it."""


class ChannelWriter:
    """The worker's end: ``put(message)`` writes the message's whole frame
    (blocking while the pipe is full: the supervisor reads it every loop).
    ``connection`` is the write end of a ``multiprocessing.Pipe``, which
    crosses to the worker when it is forked."""

    def __init__(self, connection):
        self.connection = connection

    def fileno(self) -> int:
        return self.connection.fileno()

    def put(self, message: protocol.Message) -> None:
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        if len(payload) > MAX_FRAME_BYTES:
            raise ChannelError(
                f"a {message.kind} message of {len(payload)} bytes is larger than "
                f"MAX_FRAME_BYTES={MAX_FRAME_BYTES}, the most a frame may hold"
            )
        view = memoryview(HEADER.pack(FRAME_MAGIC, len(payload)) + payload)
        while view:
            view = view[os.write(self.fileno(), view):]

    def close(self) -> None:
        """Nothing is buffered: every ``put`` has written its frame."""
        self.connection.close()


class _ProtocolUnpickler(pickle.Unpickler):
    """Loads only classes of c128a and plain containers: a frame is data."""

    def find_class(self, module: str, name: str):
        if module.startswith(ALLOWED_MODULES) or (module == "builtins" and name in (
            "frozenset", "set", "tuple", "list", "dict", "complex", "bytearray", "slice", "range",
        )):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"a frame names {module}.{name}, which no message holds")


def unpickle_message(payload: bytes) -> protocol.Message:
    try:
        return _ProtocolUnpickler(io.BytesIO(payload)).load()
    except Exception as exc:  # noqa: BLE001 - whatever a malformed payload raises
        raise ChannelError(
            f"a frame of {len(payload)} bytes does not unpickle "
            f"({type(exc).__name__}: {exc}); its start: {bytes(payload[:40])!r}"
        ) from exc


class ChannelReader:
    """The supervisor's end of worker ``index``'s channel, read without
    blocking. :meth:`get_nowait` is the next message (``queue.Empty`` when no
    whole frame has arrived), or a :class:`ChannelError`."""

    def __init__(self, connection):
        self.connection = connection
        os.set_blocking(connection.fileno(), False)
        self.buffer = bytearray()
        self.ended = False  # the worker's end is closed: nothing more comes

    def _fill(self) -> None:
        read = 0
        while not self.ended and read < READ_LIMIT_BYTES:
            try:
                chunk = os.read(self.connection.fileno(), 1 << 20)
            except BlockingIOError:
                return
            if not chunk:
                self.ended = True
                return
            self.buffer += chunk
            read += len(chunk)

    def _frame(self) -> bytes | None:
        # Checked from the first byte: a few stray bytes wait for nothing.
        if not FRAME_MAGIC.startswith(bytes(self.buffer[:len(FRAME_MAGIC)])):
            raise ChannelError(
                f"bytes that are not a frame: {bytes(self.buffer[:40])!r} (a frame starts "
                f"with {FRAME_MAGIC!r} and its length)"
            )
        if len(self.buffer) < HEADER.size:
            return None
        _, length = HEADER.unpack_from(self.buffer)
        if length > MAX_FRAME_BYTES:
            raise ChannelError(
                f"a frame header announces {length} bytes, more than MAX_FRAME_BYTES="
                f"{MAX_FRAME_BYTES}, the most a frame may hold"
            )
        if len(self.buffer) < HEADER.size + length:
            return None
        payload = bytes(self.buffer[HEADER.size:HEADER.size + length])
        del self.buffer[:HEADER.size + length]
        return payload

    def get_nowait(self) -> protocol.Message:
        payload = self._frame()
        if payload is None:
            self._fill()
            payload = self._frame()
        if payload is None:
            raise queue.Empty
        return unpickle_message(payload)

    def unfinished_frame(self) -> str | None:
        """Once the channel has ended: what it holds that is not a whole
        frame, described; None when nothing."""
        if not self.ended or not self.buffer:
            return None
        if len(self.buffer) < HEADER.size:
            return f"the channel ended inside a frame header: {bytes(self.buffer)!r}"
        _, length = HEADER.unpack_from(self.buffer)
        return (f"the channel ended inside a frame announcing {length} bytes, of which "
                f"{len(self.buffer) - HEADER.size} came")

    def close(self) -> None:
        self.connection.close()
