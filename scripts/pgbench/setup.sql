-- Tables shaped as the PostgreSQL store's (schema 5) in a schema of their
-- own, with 1,000 running runs, and a key-value table for the raw upsert.
-- The schema must not exist yet: a schema of that name that is someone
-- else's is never dropped (compare.sh drops only the one it made).
CREATE SCHEMA steadfast_pgbench;
SET search_path = steadfast_pgbench;
CREATE TABLE runs (
    run_id text COLLATE "C" PRIMARY KEY, workflow text COLLATE "C" NOT NULL,
    status text COLLATE "C" NOT NULL, next bigint NOT NULL, version bigint NOT NULL,
    created_at bigint NOT NULL, updated_at bigint NOT NULL, head text NOT NULL,
    snapshot text NOT NULL, snapshot_steps text NOT NULL, snapshot_next bigint NOT NULL,
    snapshot_bytes bigint NOT NULL, delta_bytes bigint NOT NULL, wake_at bigint,
    claimed_by text, claimed_until bigint
) WITH (fillfactor = 70);
CREATE INDEX ON runs (status, run_id);
CREATE INDEX ON runs (workflow, run_id);
CREATE INDEX ON runs (wake_at) WHERE wake_at IS NOT NULL;
CREATE TABLE steps (
    run_id text COLLATE "C" NOT NULL, idx bigint NOT NULL, name text NOT NULL,
    update_json text NOT NULL, attempt bigint NOT NULL, started_at bigint NOT NULL,
    finished_at bigint NOT NULL, PRIMARY KEY (run_id, idx)
);
INSERT INTO runs
SELECT 'run-' || i, 'w', 'running', 0, 1, 0, 0,
       '{"format":1,"attempts":0,"writer":"0000000000000001","origin":{"steps":10}}',
       '{}', '[]', 0, 2, 0, 0
FROM generate_series(1, 1000) i;
CREATE TABLE kv (k bigint PRIMARY KEY, v text NOT NULL);
-- The step's row guarded by the run's version read after a shared
-- advisory lock (held in memory, never written to the log) that a head
-- write would take exclusively; a function, so that the read takes its
-- snapshot after the lock is granted.
CREATE FUNCTION advisory_step(p_run text, p_idx bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtext(p_run));
    INSERT INTO steadfast_pgbench.steps (run_id, idx, name, update_json, attempt, started_at, finished_at)
    SELECT p_run, p_idx, 's3', '{"s3":3}', 1, 5, 6 FROM steadfast_pgbench.runs r
    WHERE r.run_id = p_run AND r.version > 0
    ON CONFLICT (run_id, idx) DO NOTHING;
END $$;
