"""`trainhook convert`: Kubeflow training jobs into trainhook manifests.

core.py converts a job (pod templates, names, warnings); policies.py maps the fields besides the templates and
the lifecycle (scheduling, MPI, PyTorch's options); run_policy.py the lifecycle (restartPolicy, runPolicy);
cli.py is the command. The names below (core.py's `__all__`) keep `from trainhook.convert import convert_text`
working as it did when convert was one module.
"""

from trainhook.convert.core import KINDS, MPI_IMPLEMENTATION, SLOTS_PER_WORKER, Converted, ConvertError, \
    convert_job, convert_text, load_documents

__all__ = ["KINDS", "ConvertError", "Converted", "MPI_IMPLEMENTATION", "SLOTS_PER_WORKER", "convert_job",
           "convert_text", "load_documents"]
