-- finding_kv_expired/released_clean: the clean twin of released: no finding of any kind.
--
-- As kv_expired, and every prefill rank also wrote its release record for the request:
-- the decode side's expiry and the prefill side's four releases are one finding.
SELECT kind, engine_id, request_id, rank FROM analysis
