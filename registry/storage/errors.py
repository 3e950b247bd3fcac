"""How the S3 adapter reports a failure: :class:`StorageError`, and the size of the chunks it streams in."""

from botocore.exceptions import ClientError, EndpointConnectionError

CHUNK_BYTES = 8 * 1024 * 1024


class StorageError(Exception):
    """S3 failed or disagreed with what was expected.

    Attributes:
        message: what went wrong, safe to show.
        retryable: True when the endpoint could not be reached (retrying may
            help); False when S3 answered and the answer was wrong.
        code: S3's error code when S3 answered (``NoSuchUpload``, …), else "".
    """

    def __init__(self, message: str, *, retryable: bool, code: str = ""):
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.code = code


def _wrap(exc: Exception, doing: str) -> StorageError:
    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        retryable = code in {"SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout"}
        return StorageError(f"S3 refused to {doing}: {code or exc}", retryable=retryable, code=code)
    if isinstance(exc, EndpointConnectionError):
        return StorageError(f"S3 endpoint unreachable while trying to {doing}", retryable=True)
    return StorageError(f"S3 error while trying to {doing}: {exc}", retryable=True)
