"""The launcher room: the in-pod set (launcher/, trainhook/gang/keys.py, trainhook/gang/) as real processes on this
machine: `trainhook-launch` run/wait/torchrun/tf-config/mpi-worker/kubexec, the coordinator and its wire format,
delivery into a training image, and the in-pod boundary (standard library only, Python 3.8). The notary a gang
talks to is tests/support/gang_notary.py's. No fixture of its own."""
