-- _instance_engines: which engine an instance folder belongs to.
-- include:
--
-- Prometheus scrapes carry no NIXL engine id, only the folder they were found in (and
-- vLLM's engine index label). A vLLM log found in the same folder names the engine; when
-- no log does, the folder's name stands for the engine, as it does for logs without a
-- NIXL engine id. An instance is the folder's whole path: two runs' folders of the same
-- name (logs/0421/decode-0, logs/0422/decode-0) are two instances, not one series.
--
-- Columns:
--   instance    path of the folder holding the objects
--   folder      its last name (what stores written before paths were kept call the instance)
--   engine_id   the NIXL engine id a log in that folder reported (one per folder)
-- A log read before its `Initializing NIXL worker` line falls back to the folder name;
-- a real id from another read of the folder wins over that fallback.
CREATE OR REPLACE VIEW _instance_engines AS
-- the one rule, shared with ingest: store/instances.py (_instance_folders)
SELECT instance, folder, engine_id FROM _instance_folders;
