-- An alert's kind is the name of the rule that raised it, declared in code (`AlertKind`, each rule
-- in the monitor's list): the schema checks the name's form, not a list of kinds, so a new rule
-- needs no migration.
ALTER TABLE alerts DROP CONSTRAINT alerts_kind_check;
ALTER TABLE alerts ADD CONSTRAINT alerts_kind_check CHECK (kind ~ '^[a-z][a-z0-9_]{0,39}$');
ALTER TABLE alert_silences DROP CONSTRAINT alert_silences_kind_check;
ALTER TABLE alert_silences ADD CONSTRAINT alert_silences_kind_check CHECK (kind ~ '^[a-z][a-z0-9_]{0,39}$');
