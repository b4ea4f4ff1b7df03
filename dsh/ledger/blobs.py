"""What the ledger knows of attachment blobs: their size caps and the error for a missing one.

The attachment *store* (content-addressed files beside the session ledgers) belongs to the
ledger; what an attachment is, how it is read, checked and encoded for a provider lives in
:mod:`dsh.llm.attachments`, which re-exports these names.
"""

from __future__ import annotations

from dsh.core.errors import LedgerError

#: The largest attachment of each kind, in bytes (why these: :mod:`dsh.llm.attachments`).
MAX_BYTES = {"image": 20 * 1024 * 1024, "pdf": 32 * 1024 * 1024}
#: The most any blob read takes: the largest attachment (one byte more says "too large").
READ_CAP = max(MAX_BYTES.values())


class AttachmentMissing(LedgerError):
    """A recorded attachment's bytes are missing from the store or no longer match their hash;
    the message names the attachment and where it was looked for. Nothing was sent."""
