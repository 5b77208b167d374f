"""Self-managed certificate decisions (certs/lifecycle.py), with the clock injected: no waiting, no mocks."""

from __future__ import annotations

import base64
import datetime as dt

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from trainhook.certs import lifecycle
from trainhook.certs.build import CA_FILE, CERT_FILE, CLOCK_SKEW, KEY_FILE, KeyPair, build_ca, build_serving_pair
from trainhook.certs.lifecycle import CA_KEY_FILE, Action, Policy, decide

T0 = dt.datetime(2025, 3, 1, 12, 0, tzinfo=dt.timezone.utc)
HOSTS = ["trainhook", "trainhook.ml", "trainhook.ml.svc", "trainhook.ml.svc.cluster.local"]
DAY = dt.timedelta(days=1)
YEAR = dt.timedelta(days=365)


def leaf(data) -> x509.Certificate:
    return x509.load_pem_x509_certificates(data[CERT_FILE])[0]


def bundle(data) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(data[CA_FILE])


def signer(data) -> x509.Certificate:
    public_key = serialization.load_pem_private_key(data[CA_KEY_FILE], password=None).public_key()
    (found,) = [ca for ca in bundle(data) if ca.public_key() == public_key]
    return found


def served_chain_is_valid(data, now: dt.datetime) -> None:
    """What the API server checks: the leaf is in its validity, for our names, issued by a bundled CA."""
    cert = leaf(data)
    assert cert.not_valid_before_utc <= now < cert.not_valid_after_utc
    assert lifecycle.sans(cert) == frozenset(HOSTS)
    (issuer,) = [ca for ca in bundle(data) if lifecycle.issued_by(cert, ca)]
    assert issuer.not_valid_before_utc <= now < issuer.not_valid_after_utc


@pytest.fixture(scope="module")
def fresh():
    return lifecycle.fresh_data(HOSTS, T0)


# --- create and keep ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("data", [None, {}], ids=["no-secret", "empty-secret"])
def test_nothing_yet_creates_a_ca_and_a_serving_pair(data):
    decision = decide(data, HOSTS, T0)
    assert decision.action is Action.CREATE and decision.changed
    assert set(decision.data) == {CA_FILE, CA_KEY_FILE, CERT_FILE, KEY_FILE}
    served_chain_is_valid(decision.data, T0)
    assert [c.subject for c in bundle(decision.data)] == [signer(decision.data).subject]


def test_fresh_certificates_are_kept_unchanged(fresh):
    for later in (T0, T0 + DAY, T0 + 200 * DAY):
        decision = decide(fresh, HOSTS, later)
        assert decision.action is Action.KEEP and not decision.changed
        assert decision.data == fresh


def test_not_before_is_backdated_for_clock_skew(fresh):
    assert leaf(fresh).not_valid_before_utc == T0 - CLOCK_SKEW
    assert signer(fresh).not_valid_before_utc == T0 - CLOCK_SKEW


def test_hostnames_in_another_order_are_the_same_names(fresh):
    assert decide(fresh, list(reversed(HOSTS)), T0).action is Action.KEEP


def test_a_serving_certificate_needs_a_hostname():
    with pytest.raises(ValueError, match="hostname"):
        decide(None, [], T0)


# --- serving rotation --------------------------------------------------------------------------------------------

def test_the_serving_pair_rotates_once_less_than_a_third_of_its_validity_remains(fresh):
    validity = leaf(fresh).not_valid_after_utc - leaf(fresh).not_valid_before_utc
    renew_at = leaf(fresh).not_valid_after_utc - validity / 3
    assert decide(fresh, HOSTS, renew_at - dt.timedelta(minutes=1)).action is Action.KEEP
    decision = decide(fresh, HOSTS, renew_at + dt.timedelta(minutes=1))
    assert decision.action is Action.ROTATE_SERVING
    assert "expires" in decision.reason
    # The CA stays: the caBundle the API server holds keeps working.
    assert decision.data[CA_FILE] == fresh[CA_FILE] and decision.data[CA_KEY_FILE] == fresh[CA_KEY_FILE]
    assert leaf(decision.data).serial_number != leaf(fresh).serial_number
    served_chain_is_valid(decision.data, renew_at)
    assert decide(decision.data, HOSTS, renew_at).action is Action.KEEP


def test_changed_hostnames_rotate_the_serving_pair(fresh):
    wanted = HOSTS[:3] + ["trainhook.ml.svc.corp.example", "10.0.0.7"]
    decision = decide(fresh, wanted, T0 + DAY)
    assert decision.action is Action.ROTATE_SERVING and "names" in decision.reason
    assert lifecycle.sans(leaf(decision.data)) == frozenset(wanted)
    assert decision.data[CA_FILE] == fresh[CA_FILE]
    assert decide(decision.data, wanted, T0 + DAY).action is Action.KEEP


def other_pair(now=T0):
    stranger = build_ca("someone-else", now)
    return stranger, build_serving_pair(stranger, HOSTS, now)


def corrupt_serving(fresh, case):
    _, foreign = other_pair()
    return {
        "tls.crt-missing": {k: v for k, v in fresh.items() if k != CERT_FILE},
        "tls.key-missing": {k: v for k, v in fresh.items() if k != KEY_FILE},
        "tls.crt-garbage": {**fresh, CERT_FILE: b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"},
        "tls.key-garbage": {**fresh, KEY_FILE: b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"},
        "tls.key-of-another-certificate": {**fresh, KEY_FILE: foreign.key_pem},
        "tls.crt-issued-by-a-foreign-ca": {**fresh, CERT_FILE: foreign.cert_pem, KEY_FILE: foreign.key_pem},
    }[case]


@pytest.mark.parametrize("case", ["tls.crt-missing", "tls.key-missing", "tls.crt-garbage", "tls.key-garbage",
                                  "tls.key-of-another-certificate", "tls.crt-issued-by-a-foreign-ca"])
def test_a_corrupt_serving_pair_is_reissued_by_the_same_ca(fresh, case):
    decision = decide(corrupt_serving(fresh, case), HOSTS, T0 + DAY)
    assert decision.action is Action.ROTATE_SERVING and "unusable" in decision.reason
    assert decision.data[CA_FILE] == fresh[CA_FILE] and decision.data[CA_KEY_FILE] == fresh[CA_KEY_FILE]
    served_chain_is_valid(decision.data, T0 + DAY)


def test_an_expired_serving_certificate_is_reissued(fresh):
    decision = decide(fresh, HOSTS, T0 + 400 * DAY)
    assert decision.action is Action.ROTATE_SERVING
    served_chain_is_valid(decision.data, T0 + 400 * DAY)


@pytest.mark.parametrize("case", ["ca.crt-missing", "ca.key-missing", "ca.crt-garbage", "ca.crt-not-pem",
                                  "ca.key-of-another-ca", "ca-expired"])
def test_a_corrupt_ca_recreates_everything(fresh, case):
    stranger, _ = other_pair()
    data, now = {
        "ca.crt-missing": ({k: v for k, v in fresh.items() if k != CA_FILE}, T0),
        "ca.key-missing": ({k: v for k, v in fresh.items() if k != CA_KEY_FILE}, T0),
        "ca.crt-garbage": ({**fresh, CA_FILE: b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"}, T0),
        "ca.crt-not-pem": ({**fresh, CA_FILE: b"\x00\x01binary"}, T0),
        "ca.key-of-another-ca": ({**fresh, CA_KEY_FILE: stranger.key_pem}, T0),
        "ca-expired": (fresh, T0 + 11 * YEAR),
    }[case]
    decision = decide(data, HOSTS, now)
    assert decision.action is Action.CREATE and "the CA is unusable" in decision.reason
    assert signer(decision.data) != signer(fresh)
    served_chain_is_valid(decision.data, now)


# --- CA rotation with overlap ------------------------------------------------------------------------------------

def recent_leaf_under_old_ca(fresh, now):
    """The Secret as it looks years on: the same CA, a serving pair it issued recently."""
    old = KeyPair(signer(fresh).public_bytes(serialization.Encoding.PEM), fresh[CA_KEY_FILE])
    pair = build_serving_pair(old, HOSTS, now - 30 * DAY)
    return {**fresh, CERT_FILE: pair.cert_pem + old.cert_pem, KEY_FILE: pair.key_pem}


def test_a_ca_near_expiry_is_rotated_with_the_old_one_kept_in_the_bundle(fresh):
    now = T0 + 7 * YEAR  # 3 of 10 years left: less than a third
    before = recent_leaf_under_old_ca(fresh, now)
    assert decide(before, HOSTS, now - YEAR).action is Action.KEEP
    decision = decide(before, HOSTS, now)
    assert decision.action is Action.ROTATE_CA
    new_ca, old_ca = bundle(decision.data)
    assert old_ca == signer(fresh)
    assert signer(decision.data) == new_ca and new_ca != old_ca
    assert new_ca.not_valid_after_utc > old_ca.not_valid_after_utc
    # The serving pair stays as it is: the old CA, still in the bundle, vouches for it.
    assert (decision.data[CERT_FILE], decision.data[KEY_FILE]) == (before[CERT_FILE], before[KEY_FILE])
    served_chain_is_valid(decision.data, now)


def test_the_serving_pair_moves_to_the_new_ca_only_once_the_api_server_has_trusted_it_a_while(fresh):
    now = T0 + 7 * YEAR
    rotated = decide(recent_leaf_under_old_ca(fresh, now), HOSTS, now).data
    new_ca, old_ca = bundle(rotated)
    later = now + Policy().propagation
    # Unknown caBundle, a caBundle without the new CA, or too soon: stay on the old CA.
    assert decide(rotated, HOSTS, later, trusted=None).action is Action.KEEP
    assert decide(rotated, HOSTS, later, trusted=[old_ca]).action is Action.KEEP
    assert decide(rotated, HOSTS, later - dt.timedelta(seconds=1), trusted=[new_ca, old_ca]).action is Action.KEEP
    moved = decide(rotated, HOSTS, later, trusted=[new_ca, old_ca])
    assert moved.action is Action.ROTATE_SERVING and "new CA" in moved.reason
    assert lifecycle.issued_by(leaf(moved.data), new_ca)
    assert bundle(moved.data) == [new_ca, old_ca]  # overlap: replicas still serving the old pair stay trusted
    assert decide(moved.data, HOSTS, later, trusted=[new_ca, old_ca]).action is Action.KEEP

    # Once the new pair has been in the Secret long enough for every replica to serve it, the old CA leaves.
    retired_at = later + Policy().retirement
    assert decide(moved.data, HOSTS, retired_at - dt.timedelta(seconds=1), trusted=[new_ca, old_ca]).action \
        is Action.KEEP
    pruned = decide(moved.data, HOSTS, retired_at, trusted=[new_ca, old_ca])
    assert pruned.action is Action.PRUNE and "retired" in pruned.reason
    assert bundle(pruned.data) == [new_ca]
    assert pruned.data[CERT_FILE] == moved.data[CERT_FILE]


def test_a_deleted_secret_gets_a_new_ca_and_the_cas_the_api_server_trusts_stay_until_every_replica_moved(fresh):
    """The Secret is deleted (or its CA is unusable) while replicas serve the old pair: the new bundle holds the
    new CA and the CAs every caBundle trusts today, so those replicas are not refused before they sync."""
    old_ca = signer(fresh)
    now = T0 + DAY
    for data in (None, {**fresh, CA_KEY_FILE: b"lost"}):
        recreated = decide(data, HOSTS, now, trusted=[old_ca])
        assert recreated.action is Action.CREATE and "stay in the bundle" in recreated.reason
        new_ca = signer(recreated.data)
        assert bundle(recreated.data) == [new_ca, old_ca]
        assert lifecycle.issued_by(leaf(recreated.data), new_ca)
        # The old pair (what a replica that has not synced yet serves) verifies against the new bundle.
        assert lifecycle.issued_by_any(leaf(fresh), bundle(recreated.data))
        trusted = bundle(recreated.data)
        assert decide(recreated.data, HOSTS, now + Policy().retirement - dt.timedelta(seconds=1),
                      trusted=trusted).action is Action.KEEP
        pruned = decide(recreated.data, HOSTS, now + Policy().retirement, trusted=trusted)
        assert pruned.action is Action.PRUNE and bundle(pruned.data) == [new_ca]
    # A stranger's certificate that is no CA, or an expired CA, is not carried over.
    stranger_leaf = leaf(fresh)
    expired = build_ca("expired", T0 - 11 * YEAR, days=365)
    carried = decide(None, HOSTS, now, trusted=[stranger_leaf, *x509.load_pem_x509_certificates(expired.cert_pem)])
    assert len(bundle(carried.data)) == 1


def test_twelve_years_of_syncs_never_serve_a_chain_the_api_server_does_not_already_trust():
    """Syncs every 3 days for twelve years, the caBundle published after each (as the manager does): at every
    step the served chain is valid, and (after the first) issued by a CA the caBundle held *before* the step.
    The CA rotates once, its predecessor is pruned once every replica serves the new CA's pair."""
    data, published, actions = None, [], []
    now = T0
    while now < T0 + 12 * YEAR:
        decision = decide(data, HOSTS, now, trusted=published or None)
        actions.append(decision.action)
        data = decision.data
        served_chain_is_valid(data, now)
        assert decision.action is Action.CREATE or lifecycle.issued_by_any(leaf(data), published), (now, decision)
        published = bundle(data)  # the manager then writes the Secret's bundle into the caBundle
        now += 3 * DAY
    assert actions[0] is Action.CREATE and actions.count(Action.CREATE) == 1
    assert actions.count(Action.ROTATE_CA) == 1
    assert actions.count(Action.PRUNE) == 1
    assert actions.count(Action.ROTATE_SERVING) >= 12  # yearly certificates, renewed well before expiry


def test_policy_refuses_a_serving_certificate_that_would_outlive_its_ca():
    with pytest.raises(ValueError, match="renewal window"):
        Policy(ca_lifetime=2 * YEAR, serving_lifetime=YEAR)
    with pytest.raises(ValueError, match="renew_fraction"):
        Policy(renew_fraction=1.5)


# --- the caBundle ------------------------------------------------------------------------------------------------

def b64(pem: bytes) -> str:
    return base64.b64encode(pem).decode()


def test_the_ca_bundle_is_in_place_only_when_every_webhook_holds_exactly_our_cas(fresh):
    ours = fresh[CA_FILE]
    stranger, _ = other_pair()
    assert lifecycle.bundle_in_place([b64(ours), b64(ours)], ours)
    assert lifecycle.bundle_in_place([ours.decode()], ours)  # PEM as text is read too
    assert not lifecycle.bundle_in_place([], ours)
    assert not lifecycle.bundle_in_place([b64(ours), None], ours)
    assert not lifecycle.bundle_in_place([b64(ours), ""], ours)
    assert not lifecycle.bundle_in_place([b64(ours), b64(stranger.cert_pem)], ours)
    assert not lifecycle.bundle_in_place([b64(ours + stranger.cert_pem)], ours)
    assert not lifecycle.bundle_in_place(["bm90IGEgY2VydA=="], ours)
    assert not lifecycle.bundle_in_place(["%%% not base64"], ours)


def test_trusted_everywhere_is_what_every_webhook_trusts(fresh):
    ours = fresh[CA_FILE]
    stranger, _ = other_pair()
    (our_ca,) = bundle(fresh)
    assert lifecycle.trusted_everywhere([b64(ours + stranger.cert_pem), b64(ours)]) == [our_ca]
    assert lifecycle.trusted_everywhere([b64(ours), None]) == []
    assert lifecycle.trusted_everywhere([]) == []
    assert lifecycle.issued_by_any(leaf(fresh), lifecycle.trusted_everywhere([b64(ours)]))
    assert not lifecycle.issued_by_any(leaf(fresh), lifecycle.trusted_everywhere([b64(stranger.cert_pem)]))
