"""The tcp gang wait's lines (tcp.py is the mode; gathering.py rank 0's side of it): the hello, rank 0's answers,
the MACs that sign them, each written and read here, so that both ends speak one protocol.

Who counts as a member (issue 31: a forged hello from a non-member released rank 0's barrier). Both ends pick a
fresh nonce per connection; how a member proves itself depends on what the wait holds:
- `key`: the gang's key, from the notary as the coordinator gets it (notary_client: the pod's identity token), when
  the webhook named a notary in this container. The member sends HMAC(key, both nonces, its rank), and every line
  rank 0 sends then (`missing`, `go`) carries an HMAC under both nonces and a line number (as wire.py signs the
  coordinator's, under this protocol's name): nobody without the key counts, releases a member, or replays a line.
- `address`: no notary named here (today the webhook gives the identity token to the training container only).
  Rank 0 counts a hello only from the address the claimed member's own name resolves to (its headless Service
  record): a pod elsewhere cannot answer for a member; one that takes over a member's address or record can. A
  member trusts the address it dialled.

    member -> rank 0   trainhook-gang/3 NAMESPACE JOB RANK NM
    rank 0 -> member   ok RANK0 NC MODE  |  no WHY
    member -> rank 0   proof HMAC(key, m2c|NC|NM|0|member RANK)                          (`key` only)
    rank 0 -> member   missing COUNT RANKS [MAC] ... go [MAC]     MAC = HMAC(key, c2m|NC|NM|n|LINE), `key` only
A member refuses a rank 0 of the other mode: a `key` member is never released by an unsigned `go`.
"""

from __future__ import annotations

import hashlib
import hmac

from trainhook.launcher.pod_view import GangView
from trainhook.launcher.reach import LISTED
from trainhook.launcher.wire import same_mac

PROTOCOL = "trainhook-gang/3"  # /2 counted any hello (issue 31); /1 was the symmetric all-to-all barrier
KEY, ADDRESS = "key", "address"
TO_RANK0, TO_MEMBER = "m2c", "c2m"


def mac(key: bytes, direction: str, rank0_nonce: str, member_nonce: str, number: int, text: str) -> str:
    message = "|".join((PROTOCOL, direction, rank0_nonce, member_nonce, str(number), text))
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()


def plain_ip(address: str) -> str:
    return address[len("::ffff:"):] if address.startswith("::ffff:") and "." in address else address


def barrier_hello(gang: GangView, member_nonce: str) -> bytes:
    """The line a member sends rank 0: gang identity first, so a stray connection from another gang is refused."""
    return f"{PROTOCOL} {gang.namespace} {gang.job_name} {gang.rank} {member_nonce}\n".encode()


def parse_hello(gang: GangView, line: str) -> tuple[int, str] | str:
    """Rank 0 reads a hello: (the member's rank, its nonce) for our gang, else the refusal (`no ...`) to answer."""
    parts = line.split()
    if not parts or not parts[0].startswith("trainhook-gang/"):
        return "no not-a-trainhook-hello"
    if parts[0] != PROTOCOL or len(parts) != 5:
        return f"no protocol {parts[0]}: this gang's rank 0 speaks {PROTOCOL} (a launcher of another version)"
    _, namespace, job, rank, member_nonce = parts
    if (namespace, job) != (gang.namespace, gang.job_name):
        return f"no other-gang {gang.namespace}/{gang.job_name}"
    if not rank.isdigit() or not 0 <= int(rank) < gang.size or int(rank) == gang.rank:
        return f"no bad-rank {rank}"
    if len(member_nonce) < 16:
        return "no nonce"
    return int(rank), member_nonce


def missing_line(ranks: list[int]) -> bytes:
    """What rank 0 tells its connected members about the rest: `missing <count> <first LISTED ranks>`."""
    return f"missing {len(ranks)} {','.join(str(r) for r in ranks[:LISTED]) or '-'}\n".encode()


def parse_missing(line: str) -> tuple[int, list[int]] | None:
    parts = line.split()
    if len(parts) != 3 or parts[0] != "missing" or not parts[1].isdigit():
        return None
    ranks = [int(r) for r in parts[2].split(",") if r.isdigit()]
    return int(parts[1]), ranks


def rank0_nonce(reply: str | None, rank0: int, mode: str) -> str:
    """Rank 0's nonce from its `ok` to our hello; ConnectionError for a refusal, or a rank 0 of the other mode."""
    parts = (reply or "").split()
    if len(parts) != 4 or parts[:2] != ["ok", str(rank0)]:
        raise ConnectionError(f"it answered {reply!r}" if reply else "it closed the connection")
    if parts[3] != mode:
        raise ConnectionError(f"it checks members by {parts[3]}, this member proves itself by {mode} (the pods were "
                              "admitted differently: a notary named in one gang-wait container and not the other)")
    return parts[2]


def signed_line(line: str | None, key: bytes, theirs: str, mine: str, number: int) -> str | None:
    """A line from rank 0 without its MAC, checked (`key` mode); ConnectionError for one rank 0 did not sign."""
    if line is None or not key:
        return line
    text, _, tag = line.rpartition(" ")
    if not same_mac(tag, mac(key, TO_MEMBER, theirs, mine, number, text)):
        raise ConnectionError(f"a line not signed with the gang's key came from rank 0's address: {text[:40]!r}")
    return text
