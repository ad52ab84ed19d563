"""Alembic environment and versions for the billing models; run through `billing.Database.upgrade()`."""
