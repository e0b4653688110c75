package online

import (
	"fmt"
	"strings"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
	"github.com/pgflow-upgrade/pgflow-upgrade/migrations"
)

// fileStatement returns the statement of the embedded 0.17.0 migration that
// begins with prefix (compared with whitespace collapsed). The online path
// builds the function and the indexes the switch will keep from the file
// itself, so the prepared objects are the file's, definition for definition.
func fileStatement(prefix string) (string, error) {
	all, err := migrations.All()
	if err != nil {
		return "", err
	}
	for _, m := range all {
		if m.Version != upgrade.Version {
			continue
		}
		stmts, err := m.Statements()
		if err != nil {
			return "", fmt.Errorf("online: splitting %s: %w", m.File, err)
		}
		for _, st := range stmts {
			if strings.HasPrefix(strings.Join(strings.Fields(st.Text), " "), prefix) {
				return st.Text, nil
			}
		}
		return "", fmt.Errorf("online: %s has no statement beginning %q", m.File, prefix)
	}
	return "", fmt.Errorf("online: the embedded migrations lack %s_%s", upgrade.Version, upgrade.Name)
}

// functionStatement: the file's CREATE OR REPLACE of pgflow.is_valid_queue_name.
func functionStatement() (string, error) {
	return fileStatement("create or replace function pgflow.is_valid_queue_name(")
}

// indexStatement: the file's CREATE UNIQUE INDEX IF NOT EXISTS of ix, made
// CONCURRENTLY (an invalid leftover is dropped first, so IF NOT EXISTS never
// hides one).
func indexStatement(ix Index) (string, error) {
	const head = "create unique index if not exists "
	st, err := fileStatement(head + ix.Name + " ")
	if err != nil {
		return "", err
	}
	st = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(st), ";"))
	if !strings.HasPrefix(st, head) {
		return "", fmt.Errorf("online: the file's index statement for %s is not on one line as expected: %q", ix.Name, st)
	}
	return "create unique index concurrently if not exists " + st[len(head):], nil
}
