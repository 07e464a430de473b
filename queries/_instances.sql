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
CREATE OR REPLACE VIEW _instance_engines AS
SELECT
    regexp_extract(uri, '([^/]+)/[^/]+$', 1) AS instance,
    max(engine_id) AS engine_id
FROM sources
WHERE format = 'vllm_log' AND engine_id IS NOT NULL
GROUP BY 1;
