"""Certificates for the webhook's TLS."""
