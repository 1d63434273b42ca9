-- The raw baseline: one single-row upsert per transaction.
\set k random(1, 1000)
INSERT INTO steadfast_pgbench.kv (k, v) VALUES (:k, 'a value of about forty bytes, as W1 writes')
ON CONFLICT (k) DO UPDATE SET v = excluded.v;
