-- An ordinary step's save as the store writes it: the run's head (a
-- heap-only update) and the step's history row in one statement.
\set r random(1, 1000)
\set i random(1, 1000000000000)
WITH h AS (
    UPDATE steadfast_pgbench.runs SET version = version + 1, updated_at = :i, head = head,
        next = next, delta_bytes = delta_bytes + 9, claimed_by = NULL, claimed_until = NULL
    WHERE run_id = 'run-' || :r RETURNING run_id, next),
 s AS (
    INSERT INTO steadfast_pgbench.steps (run_id, idx, name, update_json, attempt, started_at, finished_at)
    SELECT run_id, :i, 's3', '{"s3":3}', 1, 5, 6 FROM h
    ON CONFLICT (run_id, idx) DO UPDATE SET name = excluded.name)
SELECT next FROM h;
