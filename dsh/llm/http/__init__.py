"""Shared HTTP plumbing of the model adapters (MISSION A2, D9).

* :mod:`~dsh.llm.http.client` — one ``httpx.Client`` per run, kept by that module (the
  connection is dsh's: checked before each request, the body's digest checked right before
  the write) and closed by the run's cleanups (:func:`get_client`);
  cancellation that ends a blocked read at once (an abort *shuts down* the sockets the client
  opened); responses read within :data:`MAX_RESPONSE_BYTES` (:func:`read_capped`,
  :func:`iter_sse`);
* :mod:`~dsh.llm.http.settings` — :class:`HTTPSettings` (per-request timeouts, the retry
  policy, extra headers) and the URL and header helpers;
* :mod:`~dsh.llm.http.errors` — :class:`ProviderHTTPError`, HTTP failures turned into
  :class:`~dsh.core.errors.ProviderError` messages a user can act on, and retrying: bounded
  retries with exponential backoff and full jitter, honouring ``Retry-After``, and the
  process-wide pause a 429 puts on an endpoint (:data:`RATE_GATE`);
* :mod:`~dsh.llm.http.model` — :class:`HTTPModel`, the base of the OpenAI and Anthropic
  adapters: key lookup, the request and its retry loop (waits wake early when the run is
  cancelled).

This package re-exports every name the one module ``dsh.llm.http`` had, for plugins; dsh's own
code imports from the modules. httpx is imported here and in the adapters only; ``import dsh``
never pays for it.
"""

from __future__ import annotations

from dsh.llm.base import INVALID_JSON_KEY as INVALID_JSON_KEY  # re-exported
from dsh.llm.base import parse_tool_arguments as parse_tool_arguments  # re-exported
from dsh.llm.http.client import MAX_RESPONSE_BYTES as MAX_RESPONSE_BYTES  # re-exported
from dsh.llm.http.client import ResponseTooLarge as ResponseTooLarge  # re-exported
from dsh.llm.http.client import abort_client as abort_client  # re-exported
from dsh.llm.http.client import get_client as get_client  # re-exported
from dsh.llm.http.client import iter_sse as iter_sse  # re-exported
from dsh.llm.http.client import new_client as new_client  # re-exported
from dsh.llm.http.client import read_capped as read_capped  # re-exported
from dsh.llm.http.client import shutdown_socket as shutdown_socket  # re-exported
from dsh.llm.http.errors import RATE_GATE as RATE_GATE  # re-exported
from dsh.llm.http.errors import RETRY_STATUSES as RETRY_STATUSES  # re-exported
from dsh.llm.http.errors import ProviderErrors as ProviderErrors  # re-exported
from dsh.llm.http.errors import ProviderHTTPError as ProviderHTTPError  # re-exported
from dsh.llm.http.errors import RateGate as RateGate  # re-exported
from dsh.llm.http.errors import backoff as backoff  # re-exported
from dsh.llm.http.errors import parse_retry_after as parse_retry_after  # re-exported
from dsh.llm.http.errors import truncate as truncate  # re-exported
from dsh.llm.http.model import HTTPModel as HTTPModel  # re-exported
from dsh.llm.http.model import make_response as make_response  # re-exported
from dsh.llm.http.settings import HTTPSettings as HTTPSettings  # re-exported
from dsh.llm.http.settings import header_value_problem as header_value_problem  # re-exported
from dsh.llm.http.settings import is_loopback as is_loopback  # re-exported
from dsh.llm.http.settings import join_path as join_path  # re-exported
from dsh.llm.http.settings import shown_url as shown_url  # re-exported
from dsh.llm.http.settings import split_userinfo as split_userinfo  # re-exported
