"""A small HTTP/1.1 client on asyncio streams, for tests that need what
ordinary clients hide: closing mid-stream, trickling a body, sending bytes
that are not valid JSON or UTF-8, reading each server-sent event as it comes.
"""

import asyncio
import json
from urllib.parse import urlsplit


class Response:
    def __init__(self, status, headers, reader, writer):
        self.status, self.headers, self.reader, self.writer = status, headers, reader, writer
        self.chunked = headers.get("transfer-encoding", "").lower() == "chunked"
        self._buf = b""
        self._eof = False

    async def _more(self):
        """Reads the next piece of the body into the buffer; False at its end."""
        if self._eof:
            return False
        if self.chunked:
            line = await self.reader.readline()
            size = int(line.strip().split(b";")[0] or b"0", 16)
            if size == 0:
                await self.reader.readline()
                self._eof = True
                return False
            self._buf += await self.reader.readexactly(size)
            await self.reader.readexactly(2)
            return True
        n = self.headers.get("content-length")
        data = await (self.reader.readexactly(int(n)) if n is not None else self.reader.read())
        self._buf += data
        self._eof = True
        return bool(data)

    async def body(self):
        while await self._more():
            pass
        return self._buf

    async def json(self):
        return json.loads(await self.body())

    async def events(self):
        """Yields the `data:` payload of each server-sent event."""
        while True:
            while b"\n\n" not in self._buf:
                if not await self._more():
                    return
            event, self._buf = self._buf.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if line.startswith(b"data: "):
                    yield line[6:].decode()

    def close(self):
        self.writer.close()


async def request(url, method, path, body=b"", headers=None, trickle=None):
    """Sends one request; `trickle` seconds between body bytes sends it slowly."""
    u = urlsplit(url)
    reader, writer = await asyncio.open_connection(u.hostname, u.port)
    if not isinstance(body, bytes):
        body = json.dumps(body).encode()
    head = [f"{method} {path} HTTP/1.1", f"Host: {u.netloc}", "Connection: close",
            f"Content-Length: {len(body)}", "Content-Type: application/json"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
    if trickle:
        for b in body:
            writer.write(bytes([b]))
            await writer.drain()
            await asyncio.sleep(trickle)
    else:
        writer.write(body)
    await writer.drain()
    status_line = await reader.readline()
    status = int(status_line.split()[1])
    headers = {}
    while True:
        line = (await reader.readline()).decode().strip()
        if not line:
            break
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return Response(status, headers, reader, writer)


async def post_json(url, path, body, **kw):
    """(status, JSON body) of a whole request."""
    r = await request(url, "POST", path, body, **kw)
    try:
        data = await r.body()
        return r.status, json.loads(data) if data else None
    finally:
        r.close()
