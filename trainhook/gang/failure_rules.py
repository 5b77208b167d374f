"""Which failures `restart-gang` retries and which fail the gang at once: `trainhook.dev/failure-rules`.

The annotation is an ordered list of rules, `ACTION: MATCHER, MATCHER, ...`, separated by `;`:

    trainhook.dev/failure-rules: "fail-gang: 3, 42; restart-gang: 1"

ACTION is `restart-gang` (the gang restarts, within trainhook.dev/max-restarts) or `fail-gang` (it fails now).
A MATCHER is an exit code (`3`) or a range (`1-127`), a signal by name (`SIGKILL`: exit 128+9, as a shell
reports a death by signal), `signals` (any exit 128-255), or what the launcher recognized about the failure:
`lost-peer` (a member's launcher went away, or the training's output says a peer's connection was lost) and
`timeout` (an NCCL/gloo/c10d or rendezvous timeout, as torch reports it). The first rule with a matching matcher
decides (Kubernetes' podFailurePolicy reads its rules the same way); a failure no rule of the user's names falls
to the default rules, DEFAULT_TEXT: signals, lost peers and timeouts are usually transient and restart; exit
1-127 is the program's own verdict and fails at once. Kubeflow's restartPolicy ExitCode is the default without
the lost-peer and timeout matchers.

The rules only matter under `trainhook.dev/on-failure: restart-gang`; `fail-gang` retries nothing.

Pure and standard library only: the webhook checks the annotation with `parse` at admission and the coordinator
(rank 0's launcher) decides with `decide`, so both read it the same way. Every launcher's start imports it and
parses the default rules (launcher/policy.py), so its classes are plain ones, not dataclasses (issue 32: the
dataclasses module with its `inspect` was several ms of each pod's start); none is compared or changed.
"""

from __future__ import annotations

import signal

from trainhook.gang import keys

TYPE_CHECKING = False  # typing's own, without importing typing (trainhook/launcher/__init__.py says why)
if TYPE_CHECKING:
    from typing import Optional, Tuple

RESTART, FAIL = keys.RESTART_GANG, keys.FAIL_GANG
ACTIONS = (RESTART, FAIL)
LOST_PEER, TIMEOUT = "lost-peer", "timeout"  # what the launcher may recognize about a failure (its `symptom`)
SYMPTOMS = (LOST_PEER, TIMEOUT)
SIGNALS = "signals"
DEFAULT_TEXT = f"{RESTART}: {SIGNALS}, {LOST_PEER}, {TIMEOUT}; {FAIL}: 1-127"
MAX_TEXT = 1024  # an annotation longer than this is a mistake, not a policy
EXAMPLE = f"{FAIL}: 3, 42; {RESTART}: 1"


def signal_name(code: int) -> str:
    """`SIGKILL` for exit 137 (128+9); "" when the code is no death by a signal this platform names."""
    if 128 < code < 256:
        try:
            return signal.Signals(code - 128).name
        except ValueError:
            return ""
    return ""


def describe_code(code: int) -> str:
    """`137 (SIGKILL)`, `3`: an exit code as the outcome says it."""
    name = signal_name(code)
    return f"{code} ({name})" if name else str(code)


class Matcher:
    """One matcher of a rule: the exit codes low..high, or a symptom the launcher recognized."""

    __slots__ = ("text", "low", "high", "symptom")

    def __init__(self, text: str, low: int = 0, high: int = -1, symptom: str = ""):
        self.text, self.low, self.high, self.symptom = text, low, high, symptom

    def matches(self, code: int, symptom: str) -> bool:
        if self.symptom:
            return symptom == self.symptom
        return self.low <= code <= self.high


class Rule:
    __slots__ = ("action", "matchers", "default")

    def __init__(self, action: str, matchers: Tuple[Matcher, ...], default: bool = False):
        self.action, self.matchers, self.default = action, matchers, default


class RuleDecision:
    """What the rules say about one failure, and which rule said it (for the outcome's reason)."""

    __slots__ = ("action", "rule", "matcher")

    def __init__(self, action: str, rule: Rule, matcher: Matcher):
        self.action, self.rule, self.matcher = action, rule, matcher

    @property
    def restart(self) -> bool:
        return self.action == RESTART

    def words(self) -> str:
        """`rule restart-gang: signals (default)`, `rule fail-gang: 3 (trainhook.dev/failure-rules)`."""
        source = "default" if self.rule.default else keys.FAILURE_RULES
        return f"rule {self.action}: {self.matcher.text} ({source})"


class RulesError(ValueError):
    """A malformed rule list: the message says what is wrong and how to write it."""


def parse_matcher(text: str) -> Matcher:
    word = text.strip()
    if word in SYMPTOMS:
        return Matcher(word, symptom=word)
    if word == SIGNALS:
        return Matcher(word, 128, 255)
    if word.upper().startswith("SIG"):
        name = word.upper()
        try:
            number = int(getattr(signal.Signals, name))  # SIGKILL, SIGTERM, ... as Linux numbers them
        except AttributeError:
            raise RulesError(f"{word!r} is not a signal name (e.g. SIGKILL, SIGTERM, SIGSEGV)") from None
        return Matcher(name, 128 + number, 128 + number)
    low_text, dash, high_text = word.partition("-")
    if not low_text.isdigit() or (dash and not high_text.isdigit()):
        raise RulesError(f"{word!r} is not an exit code, a range (1-127), a signal name (SIGKILL), "
                         f"{SIGNALS}, {LOST_PEER} or {TIMEOUT}")
    low, high = int(low_text), int(high_text) if dash else int(low_text)
    if not 1 <= low <= high <= 255:
        raise RulesError(f"{word!r}: exit codes run from 1 to 255 (0 is success), low to high")
    return Matcher(word, low, high)


def parse(text: str, default: bool = False) -> Tuple[Rule, ...]:
    """The rules of an annotation's value; RulesError naming the first thing wrong."""
    if len(text) > MAX_TEXT:
        raise RulesError(f"longer than {MAX_TEXT} characters")
    rules = []
    for part in text.split(";"):
        if not part.strip():
            continue
        action, colon, matchers = part.partition(":")
        action = action.strip()
        if not colon or action not in ACTIONS:
            raise RulesError(f"{part.strip()!r} does not start with {RESTART}: or {FAIL}:")
        words = [m for m in matchers.split(",") if m.strip()]
        if not words:
            raise RulesError(f"{part.strip()!r} names no exit code, signal or {LOST_PEER}/{TIMEOUT}")
        rules.append(Rule(action, tuple(parse_matcher(m) for m in words), default))
    if not rules:
        raise RulesError("no rule")
    return tuple(rules)


DEFAULT_RULES = parse(DEFAULT_TEXT, default=True)


class FailureRules:
    """The user's rules (none by default) in front of the default rules."""

    __slots__ = ("rules",)

    def __init__(self, rules: Tuple[Rule, ...] = ()):
        self.rules = rules

    @classmethod
    def from_text(cls, text: Optional[str]) -> FailureRules:
        return cls(parse(text) if text and text.strip() else ())

    def decide(self, code: int, symptom: str = "") -> RuleDecision:
        """The first rule (the user's, then the default ones) with a matcher for this exit code or symptom. Every
        code 1-255 has one; anything else (a code no shell reports) fails the gang."""
        for rule in self.rules + DEFAULT_RULES:
            for matcher in rule.matchers:
                if matcher.matches(code, symptom):
                    return RuleDecision(rule.action, rule, matcher)
        return RuleDecision(FAIL, DEFAULT_RULES[-1], DEFAULT_RULES[-1].matchers[-1])
