from admission.quota import MemoryQuota, QuotaDecision, QuotaLimits, QuotaStore, make_quota  # noqa: F401
