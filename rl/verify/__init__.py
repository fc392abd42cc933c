"""Verification: the verifier, one function per check, and the in-sandbox runner."""
