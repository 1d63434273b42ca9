-- The step's history row alone, unguarded: the floor of a one-row save.
\set r random(1, 1000)
\set i random(1, 1000000000000)
INSERT INTO steadfast_pgbench.steps (run_id, idx, name, update_json, attempt, started_at, finished_at)
VALUES ('run-' || :r, :i, 's3', '{"s3":3}', 1, 5, 6)
ON CONFLICT (run_id, idx) DO NOTHING;
