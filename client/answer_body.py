"""An answer's body read within its cap: decoded as it arrives, never held past ``max_bytes``.

:class:`CappedBody` takes the body chunk by chunk as read off the wire (:func:`raw_chunks`,
:func:`async_raw_chunks`), inflating a gzip body step by step (at most
:data:`DECODE_STEP_BYTES` a step, so the caller checks its deadline or lets its event loop
run between steps), and gives up past its cap having held at most the cap and one step.
:func:`decoded_response` is the answer with its body read and decoded, as the calls' decoders
take it.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Iterator

import httpx

from tiletune.client.calls import UnexpectedAnswerError

#: The content codings an answer may come in (asked for in ``Accept-Encoding``; see :class:`CappedBody`).
ACCEPT_ENCODING = "gzip"
#: Decoded bytes made at most per step of :class:`CappedBody` (between steps: the deadline is checked,
#: the event loop runs).
DECODE_STEP_BYTES = 256 * 1024


class CappedBody:
    """An answer's body as it arrives, decoded as its ``Content-Encoding`` says, at most ``max_bytes``.

    :meth:`feed` decodes each chunk read off the wire in steps of at most ``DECODE_STEP_BYTES``,
    yielding after each; past ``max_bytes`` it raises :class:`UnexpectedAnswerError` at once, having
    held at most ``max_bytes`` and one step. Content codings: none, ``identity``, ``gzip``; another
    (one the client did not ask for) is ``httpx.DecodingError``, as is a body that does not inflate.
    """

    def __init__(self, response: httpx.Response, max_bytes: int, where: str) -> None:
        read = response.is_stream_consumed  # a transport that read (and decoded) the body: a test's
        self._inflate = None if read else _inflater(response.headers.get("content-encoding", ""))
        self._max_bytes = max_bytes
        self._where = where
        self._parts: list[bytes] = []
        self._size = 0

    def feed(self, raw: bytes) -> Iterator[None]:
        """Take one chunk as read; yields after each step of decoding."""
        if self._inflate is None:
            self._keep(raw)
            yield
            return
        data = raw
        while not self._inflate.eof:
            limit = min(self._max_bytes - self._size + 1, DECODE_STEP_BYTES)
            try:
                out = self._inflate.decompress(data, limit)
            except zlib.error as error:
                raise httpx.DecodingError(f"the gzip body does not inflate ({error})") from None
            self._keep(out)
            data = self._inflate.unconsumed_tail
            yield
            if not data and len(out) < limit:  # this chunk is decoded, nothing is pending
                return

    def content(self) -> bytes:
        """The body decoded, once the last chunk was fed."""
        if self._inflate is not None:
            try:
                self._keep(self._inflate.flush())
            except zlib.error as error:
                raise httpx.DecodingError(f"the gzip body does not inflate ({error})") from None
        return b"".join(self._parts)

    def _keep(self, data: bytes) -> None:
        self._size += len(data)
        if self._size > self._max_bytes:
            self._parts.clear()
            raise UnexpectedAnswerError(
                f"{self._where} answered more than {self._max_bytes} bytes; the answer was not read further"
            )
        if data:
            self._parts.append(data)


def _inflater(content_encoding: str) -> zlib._Decompress | None:
    """A zlib decompressor of ``content_encoding``; ``None`` for none; ``httpx.DecodingError`` for one
    this client does not read."""
    named = (coding.strip().lower() for coding in content_encoding.split(","))
    codings = [coding for coding in named if coding not in ("", "identity")]
    if not codings:
        return None
    if codings in (["gzip"], ["x-gzip"]):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    raise httpx.DecodingError(f"an answer in the content coding {content_encoding[:100]!r}, not asked for")


def raw_chunks(response: httpx.Response) -> Iterator[bytes]:
    """The body as it arrives (as the transport gave it, when it read the body itself)."""
    if response.is_stream_consumed:
        yield response.content
    else:
        yield from response.iter_raw()


async def async_raw_chunks(response: httpx.Response) -> AsyncIterator[bytes]:
    """:func:`raw_chunks` of an async answer."""
    if response.is_stream_consumed:
        yield response.content
    else:
        async for raw in response.aiter_raw():
            yield raw


#: The headers of a body as sent, dropped from the answer once its body is decoded.
_WIRE_HEADERS = ("content-encoding", "content-length", "transfer-encoding")


def decoded_response(response: httpx.Response, content: bytes) -> httpx.Response:
    """``response`` with its body read and decoded (what the calls' decoders take)."""
    headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in _WIRE_HEADERS]
    return httpx.Response(response.status_code, headers=headers, content=content, request=response.request)
