"""Errors the billing repository raises; the CLI and gateway map them to messages and HTTP statuses."""

from __future__ import annotations


class BillingError(Exception):
    """Base class of billing errors."""


class TenantExists(BillingError):
    """A tenant with this name already exists (names are unique)."""


class TenantNotFound(BillingError):
    """No tenant with this id or name."""


class KeyNotFound(BillingError):
    """No API key with this id."""


class StoreUnavailable(BillingError):
    """The database could not be reached to answer (e.g. a key lookup on a cache miss); map to 503."""
