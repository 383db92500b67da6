-- sql/008 left 20 % of each notifications page free so that a status update stays on its page (HOT).
-- A row is ~1.3 KB: a page took four and had room for the new versions of two, so under load two
-- thirds of the updates were not HOT (a new entry in each of the five indexes). With half of each
-- page free, every row on a page has room for its update: a page holds three rows of that size
-- instead of four (BENCHMARKS.md: all updates HOT, a quarter less WAL per notification).
ALTER TABLE notifications SET (fillfactor = 50);
