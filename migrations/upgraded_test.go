package migrations_test

// Databases upgraded the two ways the tool upgrades: the transactional
// `apply` (upgrade.Apply) and `apply --online` (online.Upgrade, whose switch
// runs the same file). Tests of the 0.17.0 engine's behaviour run on both,
// so a function that reaches a database by either path is the one tested.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/online"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/outcome"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/upgrade"
)

// upgradePath is one way a 0.16.0 database becomes 0.17.0.
type upgradePath struct {
	name string
	run  func(ctx context.Context, conn *pgx.Conn) error
}

var upgradePaths = []upgradePath{
	{"apply", func(ctx context.Context, conn *pgx.Conn) error {
		rep, err := upgrade.Apply(ctx, conn, upgrade.Options{LockRetries: 1})
		if err == nil && rep.Outcome != outcome.Applied {
			return fmt.Errorf("outcome %s: %s", rep.Outcome, rep.Message)
		}
		return err
	}},
	// pgflow's hop and pgmq's in one transaction: the 0.17.0 engine on
	// pgmq 1.13.1 (testdb.PGMQNewest), where every behaviour test must
	// answer as on 1.5.1.
	{"apply --pgmq " + testdb.PGMQNewest, func(ctx context.Context, conn *pgx.Conn) error {
		rep, err := upgrade.Apply(ctx, conn, upgrade.Options{LockRetries: 1, PGMQ: testdb.PGMQNewest})
		if err == nil && (rep.Outcome != outcome.Applied || rep.Report.PGMQ == nil || rep.Report.PGMQ.To != testdb.PGMQNewest) {
			return fmt.Errorf("outcome %s: %s", rep.Outcome, rep.Message)
		}
		return err
	}},
	{"apply --online", func(ctx context.Context, conn *pgx.Conn) error {
		rep, err := online.Upgrade(ctx, conn, online.Options{BatchSize: 7})
		if err == nil && rep.Outcome != outcome.Applied {
			return fmt.Errorf("outcome %s: %s", rep.Outcome, rep.Message)
		}
		return err
	}},
}

// upgraded is a fresh real 0.16.0 database upgraded by path.
func upgraded(t *testing.T, path upgradePath) *pgxpool.Pool {
	t.Helper()
	if strings.HasPrefix(path.name, "apply --pgmq") {
		testdb.RequirePGMQVersion(t, testdb.PGMQNewest) // the real pgmq's update scripts
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := testdb.Baseline(t)
	conn := testdb.Connect(t, db.DSN)
	defer conn.Close(context.Background())
	if err := path.run(ctx, conn); err != nil {
		t.Fatalf("%s: %v", path.name, err)
	}
	return db.Pool
}

// onEachPath runs f as a subtest on a database upgraded by each path.
func onEachPath(t *testing.T, f func(t *testing.T, p *pgxpool.Pool)) {
	t.Helper()
	for _, path := range upgradePaths {
		t.Run(path.name, func(t *testing.T) {
			f(t, upgraded(t, path))
		})
	}
}
