-- The step's row alone, guarded by the run's row under a key-share lock:
-- what a save of one row needs so that no head write slips in between.
\set r random(1, 1000)
\set i random(1, 1000000000000)
INSERT INTO steadfast_pgbench.steps (run_id, idx, name, update_json, attempt, started_at, finished_at)
SELECT 'run-' || :r, :i, 's3', '{"s3":3}', 1, 5, 6 FROM steadfast_pgbench.runs r
WHERE r.run_id = 'run-' || :r AND r.version > 0
FOR KEY SHARE OF r
ON CONFLICT (run_id, idx) DO NOTHING;
