-- _macros: helpers shared by the query modules.
--
-- _t(name): the value of a finding threshold from the _thresholds table (created by the
-- analyzer from its defaults and hybridtrace.toml before the views are installed).
CREATE OR REPLACE MACRO _t(n) AS (SELECT value FROM _thresholds WHERE name = n);
