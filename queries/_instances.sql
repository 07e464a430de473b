-- _instance_engines: which engine an instance folder belongs to.
--
-- Prometheus scrapes carry no NIXL engine id, only the folder they were found in (and
-- vLLM's engine index label). A vLLM log found in the same folder names the engine; when
-- no log does, the folder name stands for the engine, as it does for logs without a
-- NIXL engine id.
--
-- Columns:
--   instance    folder name holding the objects
--   engine_id   the NIXL engine id a log in that folder reported (one per folder)
-- A log read before its `Initializing NIXL worker` line falls back to the folder name;
-- a real id from another read of the folder wins over that fallback.
CREATE OR REPLACE VIEW _instance_engines AS
SELECT instance, coalesce(max(engine_id) FILTER (WHERE engine_id <> instance), instance) AS engine_id
FROM (
    SELECT regexp_extract(uri, '([^/]+)/[^/]+$', 1) AS instance, engine_id
    FROM sources
    WHERE format = 'vllm_log' AND engine_id IS NOT NULL
)
GROUP BY instance;
