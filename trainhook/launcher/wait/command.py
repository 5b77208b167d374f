"""`trainhook-launch wait`: the gang-wait init container. Block until the gang can form, at a cost that grows
linearly with the gang.

Why: a training process that starts before the names it dials resolve fails its first connect and often never
recovers (the Training Operator's most reported failure). The init container holds the training container back
until those names are there, with a deadline, and says which members are missing when it gives up.

Why not "every pod waits for every peer": that is N pods x N names per poll, O(N^2) queries against the cluster
DNS, which the whole cluster shares (issue 26: a 32-pod gang's waits took 21 s). A pod waits only for what it
will connect to; rank 0, the gang's gathering point, waits for the rest:

- `dns`: a member (rank > 0) waits until its own address (what peers dial: the MPI launcher, TF_CONFIG peers)
  and rank 0's (what it dials: the coordinator, MASTER_ADDR, the JAX coordinator) resolve. Rank 0 waits until
  every member's address resolves: it asks for the headless Service's name (one query per poll, answered with
  every published member's address) and resolves each member's own name only once the Service lists the whole
  gang, or every FULL_PASS_EVERY seconds. The headless Service publishes not-ready addresses, so this happens as
  soon as the pods exist. So with the launcher delivered, its coordinator barrier holds every training until all
  members have joined; without it (`trainhook.dev/launcher: none`), rank 0's training starts only once the whole
  gang exists, and the members' first connect (to rank 0) resolves.
- `tcp`: additionally a star barrier on its own port (training containers start after init containers, so the
  training port is never used): rank 0's wait listens, every member's wait connects to it and stays connected;
  when every member is connected rank 0 sends each of them `go`, and only then stops listening, so nobody still
  needs it. O(N) connections, one thread at rank 0 (selectors). A member learns who is missing from rank 0.

Every poll and every reconnect follows `Backoff` (launcher/reach.py, shared with the launcher's connection to the
coordinator): jittered, growing to a cap that starts low (the gang usually forms within seconds) and rises with
the time already waited, so a gang that waits minutes (a missing Service) does not keep the DNS server busy.
Names are asked as absolute names, and a member's tcp wait resolves rank 0 once and reuses the address.

This module is the command (which mode, the messages, the exit code); the `dns` mode and what both modes share
are wait_dns.py, the `tcp` barrier wait_tcp.py.
"""

from __future__ import annotations


from trainhook.launcher.pod_view import GangView
from trainhook.launcher.reach import LISTED, Backoff, describe, listen, qualified, search_domain
from trainhook.launcher.wait.dns import say, wait_dns

# Backoff, the names, describe and listen: launcher/reach.py
__all__ = ["Backoff", "describe", "listen", "qualified", "search_domain", "wait"]

EXIT_FAILED = 1  # the gang did not assemble in time (the message names who), or the barrier port is taken


def elastic_wait_view(gang: GangView) -> GangView:
    """What an elastic gang's pod waits for: its first `min` members (the ones any size within min..max has),
    never all `max` it may grow to, which would not exist. A member beyond `min` (added by a scale-up, after the
    first members' init containers are done) cannot run the tcp barrier, nobody would answer it: it waits for
    its own and rank 0's addresses (dns) instead, and torchrun's rendezvous lets it join the running gang."""
    low = gang.assembled_at
    mode = gang.gang_wait if gang.rank < low else "dns"
    if mode != gang.gang_wait:
        say(f"{gang.me} is beyond the elastic gang's first {low} members: waiting for addresses (dns) "
            f"instead of the tcp barrier, which they ran at the gang's start")
    first = gang.peers[:low] + ((gang.me,) if gang.rank >= low else ())
    return gang.replace(peers=first, gang_wait=mode, elastic=None)


def wait(gang: GangView) -> int:
    """The `wait` command: 0 when the gang is assembled, EXIT_FAILED (and a message naming who) otherwise."""
    if gang.gang_wait == "none":
        say("gang wait is off (none); not waiting")
        return 0
    if gang.elastic:
        gang = elastic_wait_view(gang)
    if gang.rank == 0:
        what = f"all {gang.size} members"
    else:
        what = f"this pod's own address and rank 0's ({gang.peers[0].address}); rank 0 waits for the rest"
    say(f"{gang.gang_wait}: waiting up to {gang.wait_timeout:g}s for {what} of {gang.namespace}/{gang.job_name}")
    if gang.gang_wait == "dns":
        result = wait_dns(gang, gang.wait_timeout)
    else:
        from trainhook.launcher.wait.tcp import wait_tcp  # here: its notary call's ssl is ~7 ms of a dns wait's start
        try:
            result = wait_tcp(gang, gang.wait_timeout)
        except OSError as e:  # the port is taken or not ours to bind: say so instead of a traceback
            say(f"cannot listen on port {gang.gang_wait_port}: {e.strerror or e}", err=True)
            return EXIT_FAILED
    if not result.missing:
        say("all peers are there")
        return 0
    listing = "; ".join(f"{p}: {result.why[p.rank]}" for p in result.missing[:LISTED])
    more = f"; and {result.count - min(LISTED, len(result.missing))} more" if result.count > LISTED else ""
    source = f" ({result.source})" if result.source else ""
    say(f"gave up after {gang.wait_timeout:g}s: {result.count} of {gang.size} members missing{source}: "
        f"{listing}{more}", err=True)
    return EXIT_FAILED
