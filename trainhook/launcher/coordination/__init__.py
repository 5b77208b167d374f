"""The gang's coordination inside its pods: rank 0's coordinator, each member's link and run loop, and the
coordinator's rules (when to start, stop, restart, end). Independent of launcher.mpi and launcher.wait.
"""
