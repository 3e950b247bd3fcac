"""Webhook URLs: refused when their host is or resolves to an address the server must not call."""

import hashlib
import hmac

import pytest
from django.test import override_settings

from modelyard.errors import InvalidInput
from promotions.webhooks import check_webhook_url, sign


@pytest.mark.parametrize("url", [
    "http://127.0.0.1/hook",
    "http://localhost:8080/hook",          # resolves to loopback
    "http://2130706433/hook",              # 127.0.0.1 written as one number
    "http://0x7f.1/hook",                  # and in hex
    "http://10.1.2.3/hook",
    "http://172.16.0.1/hook",
    "http://192.168.1.1/hook",
    "http://169.254.169.254/latest/meta-data/",  # cloud metadata, link-local
    "http://100.64.0.1/hook",              # carrier-grade NAT: not global
    "http://0.0.0.0/hook",
    "http://224.0.0.1/hook",               # multicast
    "http://[::1]/hook",
    "http://[fe80::1]/hook",
    "http://[fc00::1]/hook",
    "http://[::ffff:127.0.0.1]/hook",      # IPv4-mapped loopback
    "http://[::ffff:169.254.169.254]/hook",
])
@override_settings(WEBHOOK_ALLOW_PRIVATE=False)
def test_it_refuses_urls_that_reach_loopback_private_or_link_local_addresses(url):
    with pytest.raises(InvalidInput, match="address"):
        check_webhook_url(url)


@pytest.mark.parametrize("url", ["ftp://93.184.216.34/", "file:///etc/passwd", "http:///nohost",
                                 "http://user:pw@93.184.216.34/", "http://does-not-exist.invalid/"])
def test_it_refuses_urls_that_are_not_plain_http_to_a_resolvable_host(url):
    with pytest.raises(InvalidInput):
        check_webhook_url(url)


@override_settings(WEBHOOK_ALLOW_PRIVATE=False)
def test_it_accepts_a_public_address():
    assert check_webhook_url(" https://93.184.216.34/hooks/modelyard ") == "https://93.184.216.34/hooks/modelyard"


@override_settings(WEBHOOK_ALLOW_PRIVATE=True)
def test_the_test_setting_lets_a_receiver_on_loopback_through():
    assert check_webhook_url("http://127.0.0.1:9999/hook") == "http://127.0.0.1:9999/hook"


def test_the_signature_is_an_hmac_sha256_over_the_timestamp_and_the_body():
    body = b'{"event":"promotion"}'
    expected = hmac.new(b"0123456789abcdef", b"1700000000." + body, hashlib.sha256).hexdigest()
    assert sign("0123456789abcdef", "1700000000", body) == f"sha256={expected}"


@pytest.mark.django_db
@override_settings(WEBHOOK_ALLOW_PRIVATE=False)
def test_an_address_that_turned_internal_since_it_was_saved_is_refused_at_delivery_without_a_retry():
    from promotions.choices import DeliveryStatus
    from promotions.models import Webhook, WebhookDelivery
    from promotions.webhooks import attempt_delivery
    from tests.promotions.support import WebhookReceiver

    receiver = WebhookReceiver("0123456789abcdef")
    try:
        # As if its name resolved to a public address when saved and to loopback now.
        hook = Webhook.objects.create(url=receiver.url, secret="0123456789abcdef", events=["promotion"])
        delivery = WebhookDelivery.objects.create(webhook=hook, event="promotion", payload={})
        assert attempt_delivery(delivery.pk) is None
        delivery.refresh_from_db()
        assert delivery.status == DeliveryStatus.FAILED and "loopback" in delivery.last_error
        assert receiver.received == []
    finally:
        receiver.stop()


@pytest.mark.django_db
@override_settings(WEBHOOK_ALLOW_PRIVATE=True, WEBHOOK_MAX_ATTEMPTS=3)
def test_a_receiver_that_never_answers_gets_attempts_with_growing_backoff_then_the_delivery_fails():
    from promotions.choices import DeliveryStatus
    from promotions.models import Webhook, WebhookDelivery
    from promotions.webhooks import attempt_delivery
    from tests.fixtures.services import free_port

    hook = Webhook.objects.create(url=f"http://127.0.0.1:{free_port()}/", secret="0123456789abcdef",
                                  events=["promotion"])
    delivery = WebhookDelivery.objects.create(webhook=hook, event="promotion", payload={})
    assert [attempt_delivery(delivery.pk) for _ in range(4)] == [2.0, 4.0, None, None]
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == (DeliveryStatus.FAILED, 3)
    assert "Connection refused" in delivery.last_error or "connect" in delivery.last_error.lower()
