"""Kept so that older imports work: store roots are ``hybridtrace.store.roots``, locks ``.leases``."""

from hybridtrace.store.leases import LeaseHeld  # noqa: F401
from hybridtrace.store.roots import PARQUET_OPTIONS, BucketRoot, LocalRoot, root_of  # noqa: F401
