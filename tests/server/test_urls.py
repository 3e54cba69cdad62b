"""Signed download URLs: a file's, a conversation's base, and malformed parts (pure functions, no server)."""

from __future__ import annotations

import pytest

from mcp_sandbox.server.urls import UrlSigner

KEY = "ab" * 32


def test_a_file_url_is_valid_for_its_file_until_it_expires() -> None:
    signer = UrlSigner(b"k" * 32, "http://h:1/", ttl=60)
    url = signer.file_url(KEY, "dir/a b.txt", now=1000)
    conversation, expires, signature, name = url.split("/files/")[1].split("/", 3)
    assert name == "dir/a%20b.txt"
    assert signer.check(conversation, expires, signature, "dir/a b.txt", now=1000).verdict == "ok"
    assert signer.check(conversation, expires, signature, "dir/other.txt", now=1000).verdict == "invalid"
    assert signer.check(conversation, expires, signature, "dir/a b.txt", now=1061).verdict == "expired"
    assert signer.check(conversation, str(int(expires) + 1), signature, "dir/a b.txt", now=1000).verdict == "invalid"
    assert signer.check("cd" * 32, expires, signature, "dir/a b.txt", now=1000).verdict == "invalid"
    other_key = UrlSigner(b"x" * 32, "http://h:1", ttl=60)
    assert other_key.check(conversation, expires, signature, "dir/a b.txt", now=1000).verdict == "invalid"


def test_a_base_url_covers_every_file_of_its_conversation_only() -> None:
    signer = UrlSigner(b"k" * 32, "http://h:1", ttl=60)
    base = signer.base_url(KEY, now=1000)
    conversation, expires, signature = base.split("/files/")[1].split("/")
    for name in ("a.txt", "plots/b.png"):
        assert signer.check(conversation, expires, signature, name, now=1000).ok
    assert not signer.check("cd" * 32, expires, signature, "a.txt", now=1000).ok


@pytest.mark.parametrize(
    ("conversation", "expires", "signature"),
    [
        ("xyz", "2000", "f." + "0" * 64),
        (KEY, "-1", "f." + "0" * 64),
        (KEY, "2000", "z." + "0" * 64),
        (KEY, "2000", "f.00"),
    ],
)
def test_malformed_url_parts_are_invalid(conversation: str, expires: str, signature: str) -> None:
    signer = UrlSigner(b"k" * 32, "http://h:1", ttl=60)
    assert signer.check(conversation, expires, signature, "a.txt", now=1000).verdict == "invalid"
