-- The step's row alone, guarded by a shared advisory lock on its run and
-- the run's version read after it (setup.sql's advisory_step): a one-row
-- save that writes no lock into the run's row.
\set r random(1, 1000)
\set i random(1, 1000000000000)
SELECT steadfast_pgbench.advisory_step('run-' || :r, :i);
