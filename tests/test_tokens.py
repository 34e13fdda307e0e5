"""Tokens: bound to one environment and one user, signed with that environment's secret."""

import hashlib
import inspect
import itertools
import random
from datetime import UTC, datetime, timedelta

import jwt
import pytest
from jwt.api_jws import PyJWS

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
    acme.environment.rotate_signing_secret()
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


# sha256 of PyJWT's own segment check, the one `tokens._JWS` stands in for (PyJWT 2.15.1).
PYJWT_SEGMENT_CHECK = "c00c1d4615f8809dd3f46a36f4fd4f8591cc0a9860afc2b7bc0182dc099159a4"


def outcome(check, segment: bytes) -> tuple[str, object]:
    try:
        return "decoded", check(segment, "payload")
    except Exception as error:
        return type(error).__name__, str(error)


def test_the_codec_checks_base64url_segments_exactly_as_pyjwt_does():
    assert isinstance(tokens._CODEC._jws, tokens._JWS)
    source = inspect.getsource(PyJWS._decode_base64url_segment)
    assert hashlib.sha256(source.encode()).hexdigest() == PYJWT_SEGMENT_CHECK, (
        "PyJWT changed its segment check: compare relay.tokens._JWS with it, then update the digest"
    )
    assert "_decode_base64url_segment" in PyJWS._load.__code__.co_names
    # Every segment of up to five characters from a set with junk, padding, and last characters
    # whose unused bits are zero or not; then longer random ones.
    characters = [bytes([c]) for c in b"ABQw-_=+. "]
    segments = [b"".join(p) for n in range(6) for p in itertools.product(characters, repeat=n)]
    rng = random.Random(6)
    junk = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=+/.! \n\x00\xff"
    segments += [bytes(rng.choice(junk) for _ in range(rng.randrange(6, 48))) for _ in range(5000)]
    decoded = 0
    for segment in segments:
        ours = outcome(tokens._JWS._decode_base64url_segment, segment)
        assert ours == outcome(PyJWS._decode_base64url_segment, segment), segment
        decoded += ours[0] == "decoded"
    # Both kinds are in the corpus: segments that decode and segments refused.
    assert 0 < decoded < len(segments)


def test_a_secret_is_checked_once_per_process_and_a_refused_one_every_time():
    # The codec's HS256 is Relay's own (PyJWT keeps an instance's algorithms on `_jws`).
    hs256 = tokens._CODEC._jws.get_algorithm_by_name("HS256")
    assert isinstance(hs256, tokens._HS256)
    secret = "a-secret-of-this-test-only-long-enough-for-hs256"
    token = encode("5b1c5c2e-8a57-4b53-9d61-2f8f9a0e1b11", "linh", secret)
    before = hs256.prepared.cache_info()
    for _ in range(2):
        assert tokens._verified_claims(token, secret)["sub"] == "linh"
    after = hs256.prepared.cache_info()
    assert (after.misses - before.misses, after.hits - before.hits) == (1, 1)
    # An asymmetric key as the secret is refused by PyJWT's checks on each call, never remembered.
    for _ in range(2):
        with pytest.raises(jwt.InvalidKeyError):
            tokens._verified_claims(token, PEM_PUBLIC_KEY)
    assert hs256.prepared.cache_info().currsize == after.currsize
