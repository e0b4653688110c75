package testdb

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgmqver"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgprovider"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
)

// Template kinds.
const (
	tplEmpty    = "empty"
	tplPGMQ     = "pgmq"
	tplBaseline = "baseline"
)

var templateKinds = []string{tplEmpty, tplPGMQ, tplBaseline}

// templateComment begins the comment on every template database this
// package builds; the rest says what it holds ("kind=baseline pgmq=extension
// cron=extension"), so a binary that finds the templates already built (a
// seeded cluster) knows what it got.
const templateComment = "pgflow-upgrade test template:"

// templateInfo is one built template database.
type templateInfo struct {
	name       string
	pgmq, cron string // the fixtures kinds it holds ("extension", "standin", "")
	seeded     bool   // part of the cluster's seed: not dropped at the end
	// cronHome is the empty database left under cron.database_name for
	// pg_cron's launcher when the template was built there (see
	// buildTemplate); it goes when the template goes.
	cronHome string
}

// templatesSource is this file: how the templates are built is part of the
// seed's key, as the fixtures' own source is.
//
//go:embed templates.go
var templatesSource []byte

// templateSeed builds every template once per machine instead of once per
// test binary: a local cluster the harness starts gets them from the
// seeded cache (see pgprovider.Seed). Its key is everything the templates
// are built from: this file, the fixtures' SQL and installers, and the
// variables that choose the stand-ins.
func templateSeed() *pgprovider.Seed {
	h := sha256.New()
	h.Write(templatesSource)
	fmt.Fprintln(h, fixtures.InstallDigest(), os.Getenv(envPGMQStandIn), os.Getenv(envNoCron), os.Getenv(envPGMQVersion))
	return &pgprovider.Seed{Key: hex.EncodeToString(h.Sum(nil)), Fill: seedTemplates}
}

// seedTemplates builds the templates of every kind on a fresh cluster.
func seedTemplates(ctx context.Context, s *pgprovider.Server) error {
	c, err := cronOffered(ctx, s)
	if err != nil {
		return err
	}
	for _, kind := range templateKinds {
		if _, err := buildTemplate(ctx, s, kind, "pgflow_upgrade_tpl_"+kind, c); err != nil {
			return fmt.Errorf("building template %s: %w", kind, err)
		}
	}
	return nil
}

// cronOffered is what the server offers of pg_cron, unless the real one is
// turned off.
func cronOffered(ctx context.Context, s *pgprovider.Server) (pgprovider.CronInfo, error) {
	c, err := s.Cron(ctx)
	if err != nil {
		return c, err
	}
	if os.Getenv(envNoCron) == "1" {
		c = pgprovider.CronInfo{Why: envNoCron + "=1"}
	}
	return c, nil
}

// adoptSeededTemplates finds the templates a seeded cluster already holds.
// Server.Cron then reports cron.database_name as taken: it is the empty
// database the seed left for pg_cron's launcher, and a Baseline template
// that holds the real pg_cron says the real one is in use.
func adoptSeededTemplates(ctx context.Context) error {
	conn, err := session.Open(ctx, server.AdminDSN(), session.Admin)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `
		select d.datname, pg_catalog.shobj_description(d.oid, 'pg_database')
		  from pg_catalog.pg_database d
		 where d.datistemplate and pg_catalog.shobj_description(d.oid, 'pg_database') like $1 || '%'`, templateComment)
	if err != nil {
		return fmt.Errorf("looking for seeded templates: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name, comment string
		if err := rows.Scan(&name, &comment); err != nil {
			return err
		}
		info := templateInfo{name: name, seeded: true}
		kind := ""
		for _, field := range strings.Fields(strings.TrimPrefix(comment, templateComment)) {
			k, v, _ := strings.Cut(field, "=")
			switch k {
			case "kind":
				kind = v
			case "pgmq":
				info.pgmq = v
			case "cron":
				info.cron = v
			}
		}
		templates[kind] = info
		if kind == tplBaseline && info.cron == fixtures.CronExtension {
			cron.Available, cron.Why = true, ""
		}
	}
	return rows.Err()
}

// template returns the template database of a kind: a seeded one, or one
// built on first use and dropped when the binary ends.
func template(t testing.TB, kind string) templateInfo {
	t.Helper()
	templatesMu.Lock()
	defer templatesMu.Unlock()
	if info, ok := templates[kind]; ok {
		return info
	}
	ctx := context.Background()
	s := Server(t)
	info, err := buildTemplate(ctx, s, kind, pgprovider.RandomName("pgflow_upgrade_tpl_"+kind), cron)
	if err != nil {
		t.Fatalf("testdb: building template %s: %v", kind, err)
	}
	templates[kind] = info
	return info
}

// buildTemplate creates database name, fills it with what kind holds, says
// so in its comment, and marks it a template.
//
// With the real pg_cron, the Baseline template is built in
// cron.database_name (the only database where pg_cron's extension can be
// created), then renamed, and an empty database takes that name: pg_cron's
// launcher waits there for an extension that never comes, instead of
// failing to connect to a template that refuses connections and being
// restarted every second, a backend start each time.
func buildTemplate(ctx context.Context, s *pgprovider.Server, kind, name string, c pgprovider.CronInfo) (templateInfo, error) {
	info := templateInfo{name: name}
	built := name
	if kind == tplBaseline && c.Available {
		built = c.Database
	}
	if err := s.CreateDatabase(ctx, built, ""); err != nil {
		return info, err
	}
	err := fill(ctx, s.DSNFor(built), kind, c, name, &info)
	if err == nil {
		err = s.MarkTemplate(ctx, built)
	}
	if err != nil {
		_ = s.DropDatabase(ctx, built)
		return info, err
	}
	if built == name {
		return info, nil
	}
	if err := s.RenameDatabase(ctx, built, name); err != nil {
		_ = s.DropTemplate(ctx, built)
		return info, err
	}
	if err := s.CreateDatabase(ctx, built, ""); err != nil {
		_ = s.DropTemplate(ctx, name)
		return info, err
	}
	info.cronHome = built
	return info, nil
}

// fill builds what kind holds in the database of dsn, which becomes the
// template called name.
func fill(ctx context.Context, dsn, kind string, c pgprovider.CronInfo, name string, info *templateInfo) error {
	conn, err := session.Open(ctx, dsn, session.Admin) // builds the template
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if n, ok := upstreamKind(kind); ok {
		err = fillUpstream(ctx, conn, n, name, info)
	} else {
		err = fillFixture(ctx, conn, kind, c, name, info)
	}
	if err != nil {
		return err
	}
	// COMMENT takes no parameters: the server quotes the name and the text.
	var stmt string
	if err := conn.QueryRow(ctx, `select pg_catalog.format('comment on database %I is %L', pg_catalog.current_database(), $1::text)`,
		fmt.Sprintf("%s kind=%s pgmq=%s cron=%s", templateComment, kind, info.pgmq, info.cron)).Scan(&stmt); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, stmt)
	return err
}

// fillFixture builds the fixtures' kinds: empty, pgmq, baseline.
func fillFixture(ctx context.Context, conn *pgx.Conn, kind string, c pgprovider.CronInfo, name string, info *templateInfo) (err error) {
	if kind != tplEmpty {
		install := fixtures.InstallPGMQ
		if os.Getenv(envPGMQStandIn) == "1" {
			install = fixtures.InstallPGMQStandIn
		}
		if info.pgmq, err = install(ctx, conn); err != nil {
			return err
		}
		if v := os.Getenv(envPGMQVersion); v != "" && info.pgmq == fixtures.PGMQExtension {
			// The whole package on a later pgmq: the templates' pgmq is
			// updated as an operator would, before anything uses it.
			if _, err := pgmqver.Parse(v); err != nil {
				return fmt.Errorf("%s: %w", envPGMQVersion, err)
			}
			if _, err := conn.Exec(ctx, `alter extension pgmq update to '`+v+`'`); err != nil {
				return fmt.Errorf("%s=%s: alter extension pgmq update: %w (%s)", envPGMQVersion, v, err, pgmqSetupHint)
			}
		}
	}
	if kind == tplBaseline {
		if c.Available && conn.Config().Database == c.Database {
			if _, err := conn.Exec(ctx, `create extension if not exists pg_cron`); err != nil {
				return fmt.Errorf("create extension pg_cron: %w", err)
			}
		}
		if err := fixtures.InstallBaseline(ctx, conn); err != nil {
			return err
		}
		if info.cron, err = fixtures.CronKind(ctx, conn); err != nil {
			return err
		}
		// The jobs name the database they run in: the template's own name
		// (each clone renames them to its own).
		if _, err := conn.Exec(ctx, `update cron.job set database = $1 where database = pg_catalog.current_database()`, name); err != nil {
			return fmt.Errorf("naming the template in its cron jobs: %w", err)
		}
	}
	return nil
}
