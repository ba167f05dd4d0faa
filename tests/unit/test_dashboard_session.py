"""Dashboard sessions: signed, expiring, revocable, and bound to the admin token that issued them."""

from __future__ import annotations

from autorl_grader.dashboard.session import SESSION_TTL_S, SessionSigner

TOKEN = "0123456789abcdef0123456789abcdef"


def test_a_session_is_valid_until_it_expires() -> None:
    signer = SessionSigner(TOKEN)
    value = signer.issue(now=1000.0)
    assert TOKEN not in value
    assert signer.verify(value, now=1000.0 + SESSION_TTL_S - 1)
    assert not signer.verify(value, now=1000.0 + SESSION_TTL_S)


def test_changed_or_foreign_values_are_refused() -> None:
    signer = SessionSigner(TOKEN)
    value = signer.issue(now=1000.0)
    version, nonce, expiry, mac = value.split(".")
    later = int(expiry) + 10 * SESSION_TTL_S
    assert not signer.verify(f"{version}.{nonce}.{later}.{mac}", now=1000.0)  # expiry pushed out
    assert not signer.verify(f"{version}.{nonce}x.{expiry}.{mac}", now=1000.0)
    assert not signer.verify(value[:-1] + ("0" if value[-1] != "0" else "1"), now=1000.0)
    for junk in ("", "v1", TOKEN, f"v1.{TOKEN}", "v1.a.b.c.d", "v2.a.1.b"):
        assert not signer.verify(junk, now=1000.0)
    # Another admin token (rotated, or another deployment) does not accept it.
    assert not SessionSigner(TOKEN[::-1]).verify(value, now=1000.0)


def test_sign_out_revokes_only_that_session() -> None:
    signer = SessionSigner(TOKEN)
    mine, other = signer.issue(now=1000.0), signer.issue(now=1000.0)
    signer.revoke(mine, now=1001.0)
    assert not signer.verify(mine, now=1002.0)
    assert signer.verify(other, now=1002.0)


def test_only_the_admin_token_signs_in() -> None:
    signer = SessionSigner(TOKEN)
    assert signer.is_admin_token(TOKEN)
    assert not signer.is_admin_token(TOKEN[:-1]) and not signer.is_admin_token("")
