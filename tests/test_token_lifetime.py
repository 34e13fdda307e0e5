"""Token lifetime is capped (RELAY_MAX_TOKEN_TTL_S), however and wherever a token was minted.

Linh's token from POST /v1/tokens, and tokens acme's own backend mints with the environment's
secret: a lifetime over the cap, an `iat` ahead of the clock by more than the skew, or an `exp`
that has passed (by any margin), is refused.
"""

from datetime import UTC, datetime, timedelta

import jwt
import pytest
from channels.db import database_sync_to_async

from relay.exceptions import InvalidToken
from relay.tokens import CLOCK_SKEW_SECONDS, mint_token, verify_token
from tests.support import WAIT, WsClient, connect, timings

DAY = 86_400


def foreign(tenant, user_id: str, *, lifetime: float, issued_in: float = 0) -> str:
    """A token acme's backend minted itself: issued `issued_in` seconds from now, living `lifetime` seconds."""
    issued = datetime.now(UTC) + timedelta(seconds=issued_in)
    claims = {
        "env": str(tenant.environment.id),
        "sub": user_id,
        "iat": issued,
        "exp": issued + timedelta(seconds=lifetime),
    }
    return jwt.encode(claims, tenant.environment.signing_secret, algorithm="HS256")


def test_the_cap_defaults_to_a_day(settings):
    assert settings.RELAY_MAX_TOKEN_TTL_S == DAY


def test_minting_over_the_cap_is_refused_and_at_the_cap_allowed(acme, api_for):
    api = api_for(acme)
    over = api.call("POST", "/v1/tokens", {"user": "linh", "ttl_seconds": DAY + 1})
    assert over.status_code == 400
    assert over.json()["error"]["code"] == "invalid_request"
    at = api.call("POST", "/v1/tokens", {"user": "linh", "ttl_seconds": DAY})
    assert at.status_code == 201
    assert verify_token(at.json()["token"]).external_id == "linh"


def test_the_cap_is_the_operators(acme, api_for, settings):
    settings.RELAY_MAX_TOKEN_TTL_S = 600
    api = api_for(acme)
    assert api.call("POST", "/v1/tokens", {"user": "linh", "ttl_seconds": 601}).status_code == 400
    assert api.call("POST", "/v1/tokens", {"user": "linh", "ttl_seconds": 600}).status_code == 201


def test_a_foreign_token_living_longer_than_the_cap_is_refused(acme):
    assert verify_token(foreign(acme, "linh", lifetime=DAY)).external_id == "linh"
    with pytest.raises(InvalidToken, match="RELAY_MAX_TOKEN_TTL_S"):
        verify_token(foreign(acme, "linh", lifetime=DAY + 1))


def test_a_foreign_token_issued_in_the_future_is_refused_beyond_the_skew(acme):
    assert verify_token(foreign(acme, "linh", lifetime=600, issued_in=CLOCK_SKEW_SECONDS - 5)).external_id == "linh"
    with pytest.raises(InvalidToken):
        verify_token(foreign(acme, "linh", lifetime=600, issued_in=CLOCK_SKEW_SECONDS + 60))


def test_two_tokens_minted_in_one_second_differ(acme):
    now = datetime.now(UTC)
    first, second = (mint_token(acme.environment, "linh", 60, now=now)[0] for _ in range(2))
    assert first != second
    claims = [jwt.decode(token, options={"verify_signature": False}) for token in (first, second)]
    assert claims[0]["jti"] != claims[1]["jti"]
    assert {key: value for key, value in claims[0].items() if key != "jti"} == {
        key: value for key, value in claims[1].items() if key != "jti"
    }


@pytest.mark.live
async def test_a_live_instance_refuses_over_long_and_future_tokens_with_4401(acme, live_instances, closing):
    (gw,) = live_instances(1, **timings())
    linh = await closing(connect(gw, acme, "linh"))
    assert linh.of_type("connection.ack")[0]["user"] == "linh"
    for token in (
        foreign(acme, "tuan", lifetime=DAY + 1),
        foreign(acme, "tuan", lifetime=600, issued_in=CLOCK_SKEW_SECONDS + 60),
    ):
        refused = await closing(WsClient.open(f"ws://127.0.0.1:{gw.port}/v1/ws?token={token}"))
        assert await refused.closed(WAIT) == 4401
        assert refused.frames == []
    tuan = await closing(WsClient.open(f"ws://127.0.0.1:{gw.port}/v1/ws?token={foreign(acme, 'tuan', lifetime=DAY)}"))
    assert (await tuan.next_of("connection.ack"))["user"] == "tuan"


@pytest.mark.live
async def test_a_token_past_its_exp_is_refused_with_4401_while_one_issued_ahead_within_the_skew_opens(
    acme, live_instances, closing
):
    (gw,) = live_instances(1, **timings())
    # Expired a second ago: well within the skew a clock may have, and refused all the same.
    expired = foreign(acme, "linh", lifetime=60, issued_in=-61)
    refused = await closing(WsClient.open(gw.ws_url(expired)))
    assert await refused.closed(WAIT) == 4401
    assert refused.frames == []
    with pytest.raises(InvalidToken):
        await database_sync_to_async(verify_token)(expired)
    # The skew is for `iat`: a backend whose clock runs ahead still gets its users in.
    ahead = foreign(acme, "linh", lifetime=600, issued_in=CLOCK_SKEW_SECONDS - 5)
    linh = await closing(WsClient.open(gw.ws_url(ahead)))
    assert (await linh.next_of("connection.ack"))["user"] == "linh"
