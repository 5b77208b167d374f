"""The gang lifecycle's settings for the launcher's `run`: what to do when a member fails, the restart budget,
the deadline, and where the pod comes from (contract section 7; docs/use/gang-lifecycle.md)."""

from __future__ import annotations

from trainhook.gang import keys
from trainhook.gang.failure_rules import DEFAULT_TEXT, EXAMPLE, RulesError, parse
from trainhook.webhook.admission.member import Member, Problems


def check_lifecycle_options(annotations: dict, problems: Problems) -> None:
    """Refuse lifecycle annotations the launcher could not use (at the workload's admission and the pod's)."""
    policy = annotations.get(keys.ON_FAILURE)
    if policy is not None and policy not in keys.ON_FAILURE_VALUES:
        problems.add(keys.ON_FAILURE, policy, "unknown failure policy", f"use {' or '.join(keys.ON_FAILURE_VALUES)}")
    restarts = annotations.get(keys.MAX_RESTARTS)
    if restarts is not None and not restarts.isdigit():
        problems.add(keys.MAX_RESTARTS, restarts, "not a restart count", "use 0 or a positive integer")
    deadline = annotations.get(keys.ACTIVE_DEADLINE_SECONDS)
    if deadline is not None and not (deadline.isdigit() and int(deadline) > 0):
        problems.add(keys.ACTIVE_DEADLINE_SECONDS, deadline, "not a number of seconds",
                     "use a positive integer, or drop it for no deadline")
    check_failure_rules(annotations, problems)


def check_failure_rules(annotations: dict, problems: Problems) -> None:
    """The rules must parse (the launcher reads them the same way), and they only act under restart-gang: rules
    on a fail-gang gang would be silently ignored, so they are refused with the fix."""
    rules = annotations.get(keys.FAILURE_RULES)
    if rules is None:
        return
    try:
        parse(rules)
    except RulesError as e:
        problems.add(keys.FAILURE_RULES, rules, f"not a list of failure rules ({e})",
                     f"write ordered rules `ACTION: MATCHER, ...; ...` with ACTION {keys.RESTART_GANG} or "
                     f"{keys.FAIL_GANG} and MATCHER an exit code, a range, a signal name, signals, lost-peer or "
                     f"timeout, e.g. '{EXAMPLE}' (the default rules: '{DEFAULT_TEXT}')")
        return
    if annotations.get(keys.ON_FAILURE, keys.FAIL_GANG) != keys.RESTART_GANG:
        problems.add(keys.FAILURE_RULES, rules, f"the rules choose what {keys.RESTART_GANG} retries, and this gang's "
                     f"{keys.ON_FAILURE} is {annotations.get(keys.ON_FAILURE, keys.FAIL_GANG)!r} (it retries "
                     f"nothing)", f"set {keys.ON_FAILURE}: {keys.RESTART_GANG}, or drop {keys.FAILURE_RULES}")


def lifecycle_env(member: Member, workload: str, restart_policy: str) -> list[tuple[str, str]]:
    """The pod's controller and restart policy always; the user's lifecycle annotations when set (the
    launcher's defaults are fail-gang, 3 restarts, no deadline and the default failure rules)."""
    env = [(keys.TH_WORKLOAD, workload), (keys.TH_RESTART_POLICY, restart_policy)]
    for key, name in ((keys.ON_FAILURE, keys.TH_ON_FAILURE), (keys.MAX_RESTARTS, keys.TH_MAX_RESTARTS),
                      (keys.ACTIVE_DEADLINE_SECONDS, keys.TH_ACTIVE_DEADLINE),
                      (keys.FAILURE_RULES, keys.TH_FAILURE_RULES)):
        if key in member.options:
            env.append((name, member.options[key]))
    return env
