"""Tokens: bound to one environment and one user, signed with that environment's secret."""

from datetime import UTC, datetime, timedelta

import jwt
import pytest

from relay import tokens
from relay.exceptions import InvalidToken
from relay.tokens import mint_token, verify_token


def test_a_token_names_its_user_in_its_environment(acme):
    user = verify_token(acme.token("linh"))
    assert (user.environment_id, user.external_id) == (acme.environment.id, "linh")


def test_an_expired_token_is_refused(acme):
    token, _ = mint_token(acme.environment, "linh", 60, now=datetime.now(UTC) - timedelta(hours=1))
    assert verify_token(acme.token("linh")).external_id == "linh"
    with pytest.raises(InvalidToken):
        verify_token(token)


def encode(environment_id: object, user_id: str, key: str | None, algorithm: str = "HS256") -> str:
    """A token with the claims Relay mints, signed however the test says."""
    now = datetime.now(UTC)
    claims = {"env": str(environment_id), "sub": user_id, "iat": now, "exp": now + timedelta(hours=1)}
    return jwt.encode(claims, key, algorithm=algorithm)


def test_a_token_signed_with_another_secret_is_refused(acme):
    assert verify_token(encode(acme.environment.id, "linh", acme.environment.signing_secret)).external_id == "linh"
    with pytest.raises(InvalidToken):
        verify_token(encode(acme.environment.id, "linh", "a-secret-that-is-long-enough-but-not-the-real-one"))


def test_a_token_claiming_another_environment_is_refused(acme, globex):
    # Signed with acme's secret but naming globex: the signature only checks against globex's.
    assert verify_token(globex.token("linh")).environment_id == globex.environment.id
    with pytest.raises(InvalidToken):
        verify_token(encode(globex.environment.id, "linh", acme.environment.signing_secret))


def test_a_token_for_a_user_of_another_tenant_is_refused(acme, globex):
    assert verify_token(globex.token("zed")).external_id == "zed"
    with pytest.raises(InvalidToken):
        verify_token(acme.token("zed"))


@pytest.mark.parametrize(
    "token",
    [
        None,
        "",
        "garbage",
        "a.b.c",
        "eyJhbGciOiJub25lIn0.eyJlbnYiOiJ4In0.",
        # Payloads that are JSON but not claims: an array, null, an `env` that is no UUID.
        "a.W10.c",
        "a.bnVsbA.c",
        "a.eyJlbnYiOjF9.c",
        "a.\u00e9\u00e9.c",
    ],
)
def test_missing_and_malformed_tokens_are_refused(acme, token):
    assert verify_token(acme.token("linh")).external_id == "linh"
    with pytest.raises(InvalidToken):
        verify_token(token)


def test_the_none_algorithm_is_refused(acme):
    assert verify_token(encode(acme.environment.id, "linh", acme.environment.signing_secret)).external_id == "linh"
    with pytest.raises(InvalidToken):
        verify_token(encode(acme.environment.id, "linh", None, algorithm="none"))


def test_a_tenant_backend_can_mint_its_own_tokens_with_the_signing_secret(acme):
    now = datetime.now(UTC)
    own = jwt.encode(
        {"env": str(acme.environment.id), "sub": "tuan", "iat": now, "exp": now + timedelta(minutes=5)},
        acme.environment.signing_secret,
        algorithm="HS256",
    )
    assert verify_token(own).external_id == "tuan"


def test_rotating_the_secret_invalidates_earlier_tokens(acme):
    before = acme.token("linh")
    tokens.rotate_signing_secret(acme.environment)
    assert verify_token(acme.token("linh")).external_id == "linh"
    with pytest.raises(InvalidToken):
        verify_token(before)


PEM_PUBLIC_KEY = """-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=
-----END PUBLIC KEY-----
"""


def test_a_token_with_a_character_outside_base64url_is_refused(acme):
    token = acme.token("linh")
    assert verify_token(token).external_id == "linh"
    header, payload, signature = token.split(".")
    # Python's lenient decoder would drop the junk and read the same bytes (GHSA-hxm8-2xgr-2p9m).
    for forged in (f"{header}.{payload}.{signature[:4]}!{signature[4:]}", f"{header}.{payload}.{signature}!!!!"):
        with pytest.raises(InvalidToken):
            verify_token(forged)


def test_an_asymmetric_key_as_a_secret_is_refused(acme):
    token = acme.token("linh")
    # PyJWT refuses a PEM key as an HMAC secret: a secret must never be one.
    with pytest.raises(jwt.InvalidKeyError):
        tokens._verified_claims(token, PEM_PUBLIC_KEY)
    assert tokens._verified_claims(acme.token("linh"), acme.environment.signing_secret)["sub"] == "linh"
