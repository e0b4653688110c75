package audit_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// The failure the audit predicts, reproduced as an operator meets it: on
// pgflow 0.16.0 with upstream's example flow, pgmq's own update to the
// newest release fails in its 1.9.0 → 1.10.0 step, which alters each queue
// table by its pgmq.meta name, quoted, while the table was created in lower
// case. A lower-case flow updates.
func TestPGMQUpdateFailsOnMixedCaseQueue(t *testing.T) {
	ctx := context.Background()
	testdb.RequirePGMQVersion(t, testdb.PGMQNewest)
	db := testdb.Baseline(t)
	if err := fixtures.CreateAnalyzeWebsite(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	_, err := db.Pool.Exec(ctx, `alter extension pgmq update to '`+testdb.PGMQNewest+`'`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42P01" || !strings.Contains(pgErr.Message, `q_`+fixtures.AnalyzeWebsiteSlug) {
		t.Fatalf("the update with a mixed-case queue: want 42P01 naming pgmq.q_%s, got %v", fixtures.AnalyzeWebsiteSlug, err)
	}
	t.Logf("as expected: %v (where: %s)", err, pgErr.Where)
	if v := db.PGMQVersion(t); v != "1.5.1" {
		t.Fatalf("a failed update left pgmq at %s", v)
	}

	lower := testdb.Baseline(t)
	exec(t, lower, `select pgflow.create_flow('analyze_website')`)
	lower.UpdatePGMQ(t, testdb.PGMQNewest)
	if v := lower.PGMQVersion(t); v != testdb.PGMQNewest {
		t.Fatalf("pgmq %s after the update", v)
	}
}
