"""Each process caches environments' signing secrets briefly; a rotation is never missed."""

import uuid
from datetime import UTC, datetime, timedelta

import jwt
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from relay import tokens
from relay.exceptions import InvalidToken
from relay.models import Environment
from relay.tokens import verify_token

pytestmark = pytest.mark.usefixtures("empty_secret_cache")

ELSEWHERE = "a-secret-another-process-rotated-to-0123456789"


def _signed(environment: Environment, secret: str, user_id: str) -> str:
    now = datetime.now(UTC)
    claims = {"env": str(environment.id), "sub": user_id, "iat": now, "exp": now + timedelta(minutes=5)}
    return jwt.encode(claims, secret, algorithm="HS256")


def _environment_reads(queries: CaptureQueriesContext) -> int:
    return sum('FROM "relay_environment"' in query["sql"] for query in queries.captured_queries)


def test_the_secret_is_read_once_then_served_from_the_cache(acme):
    with CaptureQueriesContext(connection) as first:
        assert verify_token(acme.token("linh")).external_id == "linh"
    with CaptureQueriesContext(connection) as second:
        assert verify_token(acme.token("tuan")).external_id == "tuan"
    assert _environment_reads(first) == 1
    assert _environment_reads(second) == 0


def test_a_rotation_in_this_process_refuses_the_old_secret_at_once(acme):
    before = acme.token("linh")
    assert verify_token(before).external_id == "linh"  # cached now
    tokens.rotate_signing_secret(acme.environment)
    with pytest.raises(InvalidToken):
        verify_token(before)
    assert verify_token(acme.token("linh")).external_id == "linh"


def test_a_secret_rotated_by_another_process_is_accepted_at_once(acme):
    old = acme.environment.signing_secret
    assert verify_token(_signed(acme.environment, old, "linh")).external_id == "linh"  # cached now
    # Another process rotates: the row changes, this process's cache is not told.
    Environment.objects.filter(id=acme.environment.id).update(signing_secret=ELSEWHERE)
    assert verify_token(_signed(acme.environment, ELSEWHERE, "linh")).external_id == "linh"
    # The fresh read replaced the cached secret, so the old one is refused from then on.
    with pytest.raises(InvalidToken):
        verify_token(_signed(acme.environment, old, "linh"))


def test_a_cached_secret_expires(acme, monkeypatch):
    old = acme.environment.signing_secret
    monkeypatch.setattr(tokens, "SECRET_CACHE_SECONDS", 0.0)
    assert verify_token(_signed(acme.environment, old, "linh")).external_id == "linh"
    Environment.objects.filter(id=acme.environment.id).update(signing_secret=ELSEWHERE)
    # Expired at once: the old token is checked against the database's secret and refused.
    with pytest.raises(InvalidToken):
        verify_token(_signed(acme.environment, old, "linh"))


def test_unknown_environments_are_not_cached(acme):
    stranger = Environment(id=uuid.uuid4(), name="never saved")
    with pytest.raises(InvalidToken):
        verify_token(_signed(stranger, ELSEWHERE, "linh"))
    assert verify_token(acme.token("linh")).external_id == "linh"
    assert set(tokens._environments) == {acme.environment.id}


def test_forged_tokens_cost_no_query_each(acme, django_assert_max_num_queries):
    assert verify_token(acme.token("linh")).external_id == "linh"  # acme's secret cached now
    forged_signature = [_signed(acme.environment, ELSEWHERE, "linh") for _ in range(50)]
    forged_environment = [_signed(Environment(id=uuid.uuid4()), ELSEWHERE, "linh") for _ in range(50)]
    # One read of acme's row after the first bad signature; for the first unknown environment, a
    # read of its row and one of every id: then nothing, however many follow within the interval.
    with django_assert_max_num_queries(3):
        for token in forged_signature + forged_environment:
            with pytest.raises(InvalidToken):
                tokens.authenticate(token)
    # A real token of the same environment still verifies, from the cache.
    with django_assert_max_num_queries(0):
        assert tokens.authenticate(acme.token("tuan"))[1] == "tuan"


def test_a_tenant_created_in_this_process_is_let_in_at_once(make_tenant):
    with pytest.raises(InvalidToken):
        tokens.authenticate(_signed(Environment(id=uuid.uuid4()), ELSEWHERE, "linh"))  # the ids are read now
    initech = make_tenant("initech")
    initech.add_user("ana")
    assert verify_token(initech.token("ana")).external_id == "ana"
