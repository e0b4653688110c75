package datagen

import (
	"context"
	"fmt"
	"time"

	"github.com/pgflow-upgrade/pgflow-upgrade/fixtures"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/pgprovider"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
)

// Template creates on srv a template database named prefix plus a random
// suffix: the real pgflow 0.16.0 engine (the generator writes rows its
// constraints accept) and rows generated step_tasks rows (none when rows is
// 0), analyzed as Generate leaves them and checkpointed so a copy by
// STRATEGY FILE_COPY sees every page. The caller copies it with
// CREATE DATABASE ... TEMPLATE and drops it with srv.DropTemplate; on an
// error it is already dropped. took is the generation's time.
func Template(ctx context.Context, srv *pgprovider.Server, prefix string, rows int64) (name string, took time.Duration, err error) {
	name = pgprovider.RandomName(prefix)
	if err := srv.CreateDatabase(ctx, name, ""); err != nil {
		return "", 0, err
	}
	defer func() {
		if err != nil {
			_ = srv.DropDatabase(context.WithoutCancel(ctx), name)
		}
	}()
	conn, err := session.Open(ctx, srv.DSNFor(name), session.Admin) // installs and generates
	if err != nil {
		return "", 0, fmt.Errorf("connecting to the generated database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := fixtures.InstallEngine(ctx, conn); err != nil {
		return "", 0, fmt.Errorf("installing the 0.16.0 baseline: %w", err)
	}
	if rows > 0 {
		if took, err = Generate(ctx, conn, Shape{Tasks: rows}); err != nil {
			return "", 0, fmt.Errorf("generating %d step_tasks rows: %w", rows, err)
		}
	}
	if _, err := conn.Exec(ctx, "checkpoint"); err != nil {
		return "", 0, fmt.Errorf("checkpoint after generating: %w", err)
	}
	conn.Close(ctx) // a template must have no sessions to be copied
	if err := srv.MarkTemplate(ctx, name); err != nil {
		return "", 0, err
	}
	return name, took, nil
}
