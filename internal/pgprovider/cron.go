package pgprovider

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/session"
)

// CronDatabaseName is the cron.database_name a local cluster started with
// Options.Cron gets. pg_cron lets its extension be created only in that one
// database, so a harness that wants the real pg_cron builds the template it
// clones under this name.
const CronDatabaseName = "pgflow_upgrade_cron"

// withCronPreload adds pg_cron to shared_preload_libraries when this
// machine's PostgreSQL has the library; without it the server would refuse
// to start, so a machine without pg_cron simply gets a cluster without it.
func withCronPreload(settings map[string]string, logf func(string, ...any)) map[string]string {
	lib, err := cronLibrary()
	if err != nil {
		logf("pgprovider: pg_cron not preloaded: %v", err)
		return settings
	}
	out := map[string]string{}
	for k, v := range settings {
		out[k] = v
	}
	preload := "pg_cron"
	if prev := out["shared_preload_libraries"]; prev != "" {
		preload = prev + ",pg_cron"
	}
	out["shared_preload_libraries"] = preload
	out["cron.database_name"] = CronDatabaseName
	logf("pgprovider: preloading pg_cron (%s), cron.database_name = %s", lib, CronDatabaseName)
	return out
}

// cronLibrary finds pg_cron.so in the library directory of the server
// binaries openLocal would run.
func cronLibrary() (string, error) {
	bin, err := FindBinDir()
	if err != nil {
		return "", err
	}
	dirs := []string{filepath.Join(filepath.Dir(bin), "lib")}
	if out, err := exec.Command(filepath.Join(bin, "pg_config"), "--pkglibdir").Output(); err == nil {
		dirs = append([]string{strings.TrimSpace(string(out))}, dirs...)
	}
	for _, d := range dirs {
		p := filepath.Join(d, "pg_cron.so")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("no pg_cron.so next to the server binaries (Debian: apt-get install postgresql-15-cron)")
}

// CronInfo says whether the real pg_cron can be had on a server: the
// library is preloaded, the extension is available, and the database named
// by cron.database_name does not exist yet (so a harness can create it as
// its own template without touching anybody's jobs).
type CronInfo struct {
	Available bool   // the real pg_cron can be created in Database
	Database  string // cron.database_name
	Version   string // default_version of the available extension
	Why       string // when not Available: the reason, for the log
}

// Cron reports what the server offers of pg_cron.
func (s *Server) Cron(ctx context.Context) (CronInfo, error) {
	conn, err := session.Open(ctx, s.AdminDSN(), session.Admin)
	if err != nil {
		return CronInfo{}, errors.New(session.RedactText(err.Error(), s.AdminDSN()))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var info CronInfo
	var preload string
	var exists bool
	err = conn.QueryRow(ctx, `
		select pg_catalog.current_setting('shared_preload_libraries'),
		       coalesce(pg_catalog.current_setting('cron.database_name', true), ''),
		       coalesce((select default_version from pg_catalog.pg_available_extensions where name = 'pg_cron'), ''),
		       exists (select 1 from pg_catalog.pg_database
		                where datname = pg_catalog.current_setting('cron.database_name', true))`).
		Scan(&preload, &info.Database, &info.Version, &exists)
	if err != nil {
		return CronInfo{}, fmt.Errorf("asking the server about pg_cron: %w", err)
	}
	switch {
	case info.Version == "":
		info.Why = "the server has no pg_cron extension"
	case !strings.Contains(preload, "pg_cron"):
		info.Why = "pg_cron is not in shared_preload_libraries"
	case info.Database == "":
		info.Why = "cron.database_name is not set"
	case exists:
		info.Why = fmt.Sprintf("cron.database_name %q already exists on this server (its jobs are not ours to use)", info.Database)
	default:
		info.Available = true
	}
	return info, nil
}
