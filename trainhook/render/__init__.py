"""Training gangs as labeled manifests, offline: `trainhook render` and `trainhook explain`.

objects.py turns a gang into its Service, workloads and PodGroup (shared with `trainhook convert` and the SDK);
options.py builds that gang from render's flags; cli.py is the command; explain.py shows what the webhook would
make of a manifest's pods. The names below are the public Python API (docs/use/sdk.md: `from trainhook.render
import to_yaml`); explain is left out, since it loads the webhook's code.
"""

from trainhook.render.objects import ACTIVE_DEADLINE_SECONDS, KINDS, ON_FAILURE, ON_FAILURE_POLICIES, Gang, \
    RenderError, Scheduling, gang_objects, to_yaml
from trainhook.render.options import RenderOptions, parse_env, parse_roles, render

__all__ = ["ACTIVE_DEADLINE_SECONDS", "KINDS", "ON_FAILURE", "ON_FAILURE_POLICIES", "Gang", "RenderError",
           "RenderOptions", "Scheduling", "gang_objects", "parse_env", "parse_roles", "render", "to_yaml"]
