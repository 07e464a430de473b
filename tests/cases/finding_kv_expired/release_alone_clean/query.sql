-- finding_kv_expired/release_alone_clean: the clean twin of release_alone: no finding of any kind.
--
-- The decode side recorded only that the handoff failed (no read, no expiry); the prefill
-- side's release record says why. It ties to the decode request by remote_request_id, as
-- an expiry log line does: a kv_expired finding beside the transfer_failed one.
SELECT kind, engine_id, request_id, rank FROM analysis
