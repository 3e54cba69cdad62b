"""The object store (``object_store_url``): put, get, list and delete under one prefix of one bucket.

boto3 is synchronous: every method blocks, so the caller runs it in a worker thread, and
:meth:`ObjectStore.parallel` runs many transfers at once on a small pool of threads (one client,
which boto3 documents as thread-safe). A GET goes out as a presigned URL on botocore's own HTTP
session, its body streamed into the file: the client's full request pipeline costs several times
the CPU of the request itself, which decides the restore of many small files; anything but a
complete 200 falls back to the client's ``get_object`` (its retries, its error codes). The
endpoint, region and credentials come from the standard AWS environment, never from settings: no
error or log line here names them, and every boto3 error is turned into a
:class:`~mcp_sandbox.errors.WorkspaceError` that says only what failed (the log gets its code).
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, TypeVar

from mcp_sandbox.errors import ConfigError, UnavailableError, WorkspaceError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import ObjectIdentifierTypeDef

__all__ = ["ObjectStore", "StoredObject", "split_url"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

TRANSFER_THREADS = 16  # the pool of each store: S3 round trips wait on the network, not the CPU
_CONNECT_SECONDS = 5
_READ_SECONDS = 60
_CHUNK = 1 << 20
# A conditional write lost: S3 says 412 PreconditionFailed, or 409 while another conditional write is under way.
_PRECONDITION_FAILED = frozenset({"PreconditionFailed", "ConditionalRequestConflict", "412", "409"})


@dataclass(frozen=True, slots=True)
class StoredObject:
    """One object under the prefix: its name relative to the prefix, size, ETag and when it was
    last written (the store's ``LastModified`` as it sent it: parsed only where an age matters)."""

    name: str
    size: int
    etag: str
    modified: str = ""


def _down(exc: Exception) -> bool:
    """Whether ``exc`` (a botocore error, after the client's retries) says the store is down or cannot
    be reached, not that it refused: no connection, a timeout, or a 5xx answer."""
    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import HTTPClientError

    if isinstance(exc, BotoConnectionError | HTTPClientError):  # refused, timed out, closed, DNS
        return True
    response = getattr(exc, "response", None)
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) if isinstance(response, dict) else 0
    return isinstance(status, int) and status >= 500 and status != 501  # 501: a feature it lacks, not an outage


def split_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` → (``bucket``, ``some/prefix/``); the prefix is "" or ends in ``/``."""
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    prefix = prefix.strip("/")
    return bucket, f"{prefix}/" if prefix else ""


class ObjectStore:
    """The objects under ``s3://bucket/prefix``; names given to methods are relative to the prefix."""

    def __init__(self, url: str) -> None:
        """Make the client (nothing is sent yet: :meth:`check` reaches the store).

        Raises:
            ConfigError: boto3 is not installed.
        """
        if importlib.util.find_spec("boto3") is None:
            raise ConfigError(
                "object_store_url: boto3 is not installed "
                "(install mcp-sandbox with its `s3` extra: pip install 'mcp-sandbox[s3]')"
            )
        import boto3
        import botocore.session
        from botocore.config import Config
        from botocore.httpsession import URLLib3Session
        from botocore.utils import get_environ_proxies

        self.bucket, self.prefix = split_url(url)
        self.url = url
        config = Config(
            connect_timeout=_CONNECT_SECONDS,
            read_timeout=_READ_SECONDS,
            retries={"max_attempts": 3, "mode": "standard"},
            max_pool_connections=TRANSFER_THREADS * 2,
            # Checksums only where the API requires them: S3-compatible stores differ in which
            # they support, and computing a CRC of every body costs CPU that transfers share.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        core = botocore.session.get_session()
        # Timestamps (LastModified) are never read here: parsing each with dateutil costs more
        # CPU than the rest of a listed object.
        core.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=str)
        self._client: S3Client = boto3.session.Session(botocore_session=core).client("s3", config=config)
        endpoint = self._client.meta.endpoint_url
        # The HTTP session of direct GETs, made as botocore makes the client's (same CA bundle,
        # proxies, timeouts, a connection per transfer thread).
        verify: str | bool = core.get_config_variable("ca_bundle") or os.environ.get("REQUESTS_CA_BUNDLE") or True
        self._http = URLLib3Session(
            verify=verify,  # type: ignore[arg-type]  # a CA bundle's path, or True (the stubs say bool)
            proxies=get_environ_proxies(endpoint),
            timeout=(_CONNECT_SECONDS, _READ_SECONDS),  # type: ignore[arg-type]  # the client's is a pair too
            max_pool_connections=TRANSFER_THREADS * 2,
        )
        self._pool = concurrent.futures.ThreadPoolExecutor(TRANSFER_THREADS, thread_name_prefix="object-store")

    def close(self) -> None:
        """Stop the transfer threads and close the connections (idempotent)."""
        self._pool.shutdown(wait=True)
        self._http.close()

    def _fail(self, exc: Exception, what: str) -> WorkspaceError:
        code = getattr(exc, "response", {}).get("Error", {}).get("Code") if hasattr(exc, "response") else None
        logger.warning("object store %s: %s failed: %s", self.url, what, code or type(exc).__name__)
        if _down(exc):
            return UnavailableError("the object store")
        return WorkspaceError(f"the object store could not {what}" + (f" ({code})" if code else ""))

    def check(self) -> None:
        """Reach the bucket once (at start).

        Raises:
            ConfigError: the store cannot be reached, or the bucket is not there or not ours.
        """
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except Exception as exc:  # botocore's tree has no common base of network and HTTP errors
            error = self._fail(exc, f"reach the bucket {self.bucket!r}")
            raise ConfigError(
                f"object_store_url: {error} (the endpoint and credentials come from AWS_ENDPOINT_URL, "
                "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"
            ) from None

    def put(self, name: str, body: IO[bytes] | bytes) -> str:
        """Store ``body`` as ``name``; return its ETag.

        Raises:
            WorkspaceError: the store refused or could not be reached.
        """
        try:
            reply = self._client.put_object(Bucket=self.bucket, Key=self.prefix + name, Body=body)
        except Exception as exc:
            raise self._fail(exc, "store a file") from None
        return reply["ETag"]

    def put_if(self, name: str, body: bytes, etag: str | None) -> bool:
        """Store ``body`` as ``name`` only if the object is still the one of ETag ``etag`` (None: only
        if there is none); whether it was stored (False: another write came first).

        A conditional write (``If-Match``, ``If-None-Match: *``), which S3, MinIO and SeaweedFS
        honour: the store, not the writer, decides which of two racing writers wins.

        Raises:
            WorkspaceError: the store refused otherwise or could not be reached.
        """
        key = self.prefix + name
        try:
            if etag is None:
                self._client.put_object(Bucket=self.bucket, Key=key, Body=body, IfNoneMatch="*")
            else:
                self._client.put_object(Bucket=self.bucket, Key=key, Body=body, IfMatch=etag)
        except Exception as exc:
            code = getattr(exc, "response", {}).get("Error", {}).get("Code") if hasattr(exc, "response") else None
            if code in _PRECONDITION_FAILED:
                return False
            raise self._fail(exc, "store a file") from None
        return True

    def get(self, name: str, into: IO[bytes]) -> str:
        """Write object ``name`` into ``into``; return its ETag.

        Raises:
            FileNotFoundError: there is no such object.
            WorkspaceError: the store refused or could not be reached.
        """
        start = into.tell()
        try:
            etag = self._get_direct(name, into)
        except Exception as exc:  # botocore and urllib3 errors have no common base
            # The type only: the text of some names the endpoint, or the signed URL.
            logger.debug("object store %s: direct GET failed (%s), retried by the client", self.url, type(exc).__name__)
            etag = None
        if etag is not None:
            return etag
        into.seek(start)
        into.truncate()
        return self._read(name, into, None)[0]

    def get_range(self, name: str, offset: int, length: int, into: IO[bytes]) -> None:
        """Write ``length`` bytes of object ``name`` from ``offset`` into ``into``.

        Raises:
            FileNotFoundError: there is no such object.
            WorkspaceError: the store refused, could not be reached, or sent another length.
        """
        if length == 0:
            return
        if self._read(name, into, f"bytes={offset}-{offset + length - 1}")[1] != length:
            raise self._fail(RuntimeError("short range"), "read a file")

    def _read(self, name: str, into: IO[bytes], byte_range: str | None) -> tuple[str, int]:
        """Object ``name`` (``byte_range`` of it, if given) written into ``into`` by the client: its
        ETag and the bytes written.

        Raises:
            FileNotFoundError: there is no such object.
            WorkspaceError: the store refused or could not be reached.
        """
        key, received = self.prefix + name, 0
        try:
            if byte_range is None:
                reply = self._client.get_object(Bucket=self.bucket, Key=key)
            else:
                reply = self._client.get_object(Bucket=self.bucket, Key=key, Range=byte_range)
            body = reply["Body"]
            try:
                for chunk in body.iter_chunks(_CHUNK):
                    into.write(chunk)
                    received += len(chunk)
            finally:
                body.close()
        except self._client.exceptions.NoSuchKey:
            raise FileNotFoundError(name) from None
        except Exception as exc:
            raise self._fail(exc, "read a file") from None
        return reply["ETag"], received

    def _get_direct(self, name: str, into: IO[bytes]) -> str | None:
        """A presigned GET of ``name`` streamed into ``into``: its ETag, or None unless the store
        answered 200 with the whole body."""
        from botocore.awsrequest import AWSRequest

        params = {"Bucket": self.bucket, "Key": self.prefix + name}
        url = self._client.generate_presigned_url("get_object", Params=params, ExpiresIn=_READ_SECONDS * 2)
        request = AWSRequest(method="GET", url=url).prepare()
        request.stream_output = True
        reply = self._http.send(request)
        raw, whole = reply.raw, False
        try:
            etag, length = reply.headers.get("ETag"), reply.headers.get("Content-Length")
            if reply.status_code != 200 or etag is None or length is None:
                raw.drain_conn()  # an error's short body: the connection stays usable
                whole = True
                return None
            received = 0
            for chunk in raw.stream(_CHUNK, decode_content=False):
                into.write(chunk)
                received += len(chunk)
            whole = received == int(length)  # urllib3 is told not to check it
            return etag if whole else None
        finally:
            if whole:
                raw.release_conn()
            else:  # unread or torn: a connection with bytes left in it must not serve another GET
                raw.close()

    def list(self, under: str) -> list[StoredObject]:
        """Every object whose name starts with ``under`` (names relative to ``under``).

        Raises:
            WorkspaceError: the store refused or could not be reached.
        """
        found: list[StoredObject] = []
        start = self.prefix + under
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=start)
            for page in pages:
                items = page.get("Contents", [])
                found += [
                    StoredObject(
                        item["Key"][len(start) :], item["Size"], item["ETag"], str(item.get("LastModified", ""))
                    )
                    for item in items
                ]
        except Exception as exc:
            raise self._fail(exc, "list files") from None
        return found

    def delete(self, names: Iterable[str]) -> None:
        """Delete objects ``names`` (a name already gone is no error).

        Raises:
            WorkspaceError: the store refused or could not be reached.
        """
        batch = list(names)
        for start in range(0, len(batch), 1000):  # DeleteObjects takes at most 1,000 keys
            keys: list[ObjectIdentifierTypeDef] = [{"Key": self.prefix + name} for name in batch[start : start + 1000]]
            try:
                reply = self._client.delete_objects(Bucket=self.bucket, Delete={"Objects": keys, "Quiet": True})
            except Exception as exc:
                raise self._fail(exc, "delete files") from None
            if reply.get("Errors"):
                raise self._fail(RuntimeError(reply["Errors"][0].get("Code", "")), "delete files")

    def parallel(self, work: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        """``work`` of each item on the transfer threads; the results in order. The first error is
        raised once every transfer has ended (none is left running behind the caller's back)."""
        futures = [self._pool.submit(work, item) for item in items]
        concurrent.futures.wait(futures)
        return iter([future.result() for future in futures])
