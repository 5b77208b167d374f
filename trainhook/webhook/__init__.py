"""The mutating admission webhook."""
