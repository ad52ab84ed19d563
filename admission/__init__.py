from admission.quota import MemoryQuota, QuotaDecision, QuotaLimits, RedisQuota, make_quota  # noqa: F401
