"""An httpx transport with one overall deadline (``--attach URL``: dsh.llm.attachments).

httpx's timeouts bound each socket operation: a server sending one byte a second never trips
them. The transport here gives every connect, read and write only the time left until the
deadline, so the overall limit holds inside the status line and the headers too.
"""

from __future__ import annotations

import time
from typing import Any


def deadline_transport(deadline: float) -> Any:
    """An httpx transport whose every socket operation — connecting, each read of the status
    line, headers and body, each write — waits at most until ``deadline`` (monotonic): a
    server trickling one byte a second cannot stretch the overall limit, which httpx's own
    timeouts (per operation) would let it do."""
    import httpcore
    import httpx

    class Stream(httpcore.NetworkStream):
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def _left(self, timeout: float | None, what: str) -> float:
            left = deadline - time.monotonic()
            if left <= 0:
                raise (httpcore.ReadTimeout if what == "read" else httpcore.WriteTimeout)(
                    "the overall time limit passed")
            return left if timeout is None else min(timeout, left)

        def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            return bytes(self.inner.read(max_bytes, self._left(timeout, "read")))

        def write(self, buffer: bytes, timeout: float | None = None) -> None:
            self.inner.write(buffer, self._left(timeout, "write"))

        def close(self) -> None:
            self.inner.close()

        def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                      timeout: float | None = None) -> Any:
            return Stream(self.inner.start_tls(ssl_context, server_hostname,
                                               self._left(timeout, "read")))

        def get_extra_info(self, info: str) -> Any:
            return self.inner.get_extra_info(info)

    class Backend(httpcore.NetworkBackend):
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                        local_address: str | None = None, socket_options: Any = None) -> Any:
            left = deadline - time.monotonic()
            if left <= 0:
                raise httpcore.ConnectTimeout("the overall time limit passed")
            return Stream(self.inner.connect_tcp(
                host, port, left if timeout is None else min(timeout, left),
                local_address, socket_options))

        def connect_unix_socket(self, path: str, timeout: float | None = None,
                                socket_options: Any = None) -> Any:
            raise httpcore.ConnectError("unix sockets are not used for attachments")

        def sleep(self, seconds: float) -> None:
            self.inner.sleep(seconds)

    transport = httpx.HTTPTransport(trust_env=False)
    pool = transport._pool  # httpcore's pool: its network backend is where reads happen
    pool._network_backend = Backend(pool._network_backend)
    return transport
