-- A claim leases the rows it picks in one transaction: each leased row's new version must
-- find room on its own page to stay a HOT update (sql/002_hot_leases.sql). The loader now
-- writes a provider's new consents next to each other, in the order the dispatcher claims
-- them (batch/db/loaders.py), so a 700-row claim covers some 40 pages, not 700, and leases
-- a dozen rows or more on each: at fillfactor 85 most of those new versions did not fit
-- and went to other pages, with new entries in every index. Half of each page is left free
-- instead. Measured on 10,000,000 consents (tests/bench/test_claim_query.py, 2026-12-04,
-- a checkpoint before the claims): 700-row claims at the producer's cadence, one a second,
-- wrote 270 full-page images (1.93 MiB of WAL) each, p99 38.1 ms, with the rows scattered
-- at 85; 61 (0.34 MiB), p99 16.7 ms, in provider order at 50; 85 (0.58 MiB), p99 17.3 ms,
-- on the scattered table after `mydata-batch db reorder` (109 s). A second run: 268, 61 and
-- 85 images, p99 23.3, 21.2 and 27.9 ms (p50 15.5, 13.9, 12.4). In provider order at 85
-- (an earlier run, no checkpoint forced): 224 images a claim, p99 29.3 ms. The table takes
-- about 1.5 times the room (3.5 -> 5.4 GiB with its indexes). It applies to pages written
-- from now on; `mydata-batch db reorder` rewrites a table filled before, in claim order.
ALTER TABLE consents SET (fillfactor = 50);

INSERT INTO schema_migrations (version) VALUES (10) ON CONFLICT DO NOTHING;
