-- An ordinary step's save shaped as the store writes it: the run's head (a
-- heap-only update, guarded by its version, with a new head document of
-- the same size) and the step's history row in one statement.
\set r random(1, 1000)
\set i random(1, 1000000000000)
WITH h AS (
    UPDATE steadfast_pgbench.runs SET version = version + 1, updated_at = :i,
        head = '{"format":1,"attempts":0,"writer":"' || lpad(to_hex(:i::bigint), 16, '0')
            || '","origin":{"steps":10}}',
        next = next, delta_bytes = delta_bytes + 9, claimed_by = NULL, claimed_until = NULL
    WHERE run_id = 'run-' || :r AND version > 0 RETURNING run_id, next),
 s AS (
    INSERT INTO steadfast_pgbench.steps (run_id, idx, name, update_json, attempt, started_at, finished_at)
    SELECT run_id, :i, 's3', '{"s3":3}', 1, 5, 6 FROM h
    ON CONFLICT (run_id, idx) DO UPDATE SET name = excluded.name, update_json = excluded.update_json,
        attempt = excluded.attempt, started_at = excluded.started_at, finished_at = excluded.finished_at)
SELECT next FROM h;
