-- Applying an effect sets notifications.status. A notification row is large (the token, its
-- header and claims: ~1.5 KB), so a full page has no room for the new row version: every status
-- update was a non-HOT update — a new entry in each of the table's five indexes and the whole
-- row in the WAL. Leaving 20 % of each new page free lets the update stay on its page (HOT: no
-- index entries, only the changed bytes logged). status is in no index, so HOT applies.
-- Pages written before this migration keep their fill; new ones (all new notifications) get it.
ALTER TABLE notifications SET (fillfactor = 80);
