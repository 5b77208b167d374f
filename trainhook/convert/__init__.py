"""`trainhook convert`: Kubeflow training jobs into trainhook manifests.

core.py converts a job of the v1 kinds (pod templates, names, warnings); policies.py maps the fields besides the
templates and the lifecycle (scheduling, MPI, PyTorch's options); run_policy.py the lifecycle (restartPolicy,
runPolicy); trainjob.py converts a Trainer v2 TrainJob with its runtime (runtimes.py: finding it, Trainer's built-in
ones; jobset.py: the runtime's JobSet template; overrides.py: the TrainJob's pod template overrides); stream.py
reads a YAML stream of them; cli.py is the command. The names below keep `from trainhook.convert import
convert_text` working as it did when convert was one module.
"""

from trainhook.convert.core import KINDS, MPI_IMPLEMENTATION, SLOTS_PER_WORKER, Converted, ConvertError, \
    convert_job, load_documents
from trainhook.convert.runtimes import BUILTIN as BUILTIN_RUNTIMES
from trainhook.convert.stream import convert_text
from trainhook.convert.trainjob import convert_trainjob

__all__ = ["BUILTIN_RUNTIMES", "KINDS", "ConvertError", "Converted", "MPI_IMPLEMENTATION", "SLOTS_PER_WORKER",
           "convert_job", "convert_text", "convert_trainjob", "load_documents"]
