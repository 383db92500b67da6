-- Erased users leave every app transfer: their identifiers for another team, asked
-- for or not, and the exchanges of those not made yet. Rows left by erasures made before this
-- release go now, as later erasures take theirs in the same transaction.
WITH gone AS (
    DELETE FROM transfer_subs s USING transfers t, accounts a
    WHERE t.id = s.transfer_id AND a.aud = t.aud AND a.sub = s.sub AND a.erased_at IS NOT NULL
    RETURNING t.client_id, s.transfer_sub
)
DELETE FROM transfer_imports i USING transfers t, gone g
WHERE t.id = i.transfer_id AND t.direction = 'incoming' AND t.client_id = g.client_id AND i.transfer_sub = g.transfer_sub
  AND i.new_sub IS NULL;

COMMENT ON COLUMN alerts.type IS 'alerts stored before 013 (one row per series): the series; transfer_deadline: the other team (to/from TEAMID); jobs_discarded: the lane; else NULL';
