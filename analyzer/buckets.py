"""Kept so that older imports work: input objects and bucket locations are ``hybridtrace.store.objects``."""

from hybridtrace.store.objects import (  # noqa: F401
    Bucket,
    ObjectRef,
    bucket,
    is_bucket,
    list_bucket,
    list_local,
    list_objects,
    redact,
    refuse_credentials,
)
