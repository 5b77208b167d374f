"""The gang-wait init container (`trainhook-launch wait`): its dns and tcp modes. Independent of
launcher.coordination and launcher.mpi.
"""
