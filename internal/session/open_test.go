package session

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

type nopTracer struct{}

func (nopTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (nopTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestConfigShapesByPurpose: the pin, application_name, exec mode and cancel
// request each purpose gets, and what the connection string keeps.
func TestConfigShapesByPurpose(t *testing.T) {
	const dsn = "postgres://u@h:5432/d?sslmode=disable"
	for _, tc := range []struct {
		dsn      string
		o        Options
		pinned   bool
		app      string // "" : none set
		execMode pgx.QueryExecMode
		cancel   bool
	}{
		{dsn, Options{Purpose: Tool, Name: "audit"}, true, "pgflow-upgrade audit", pgx.QueryExecModeExec, true},
		{dsn + "&application_name=mine&default_query_exec_mode=simple_protocol", Options{Purpose: Tool, Name: "audit"}, true, "mine", pgx.QueryExecModeSimpleProtocol, true},
		{dsn, Options{Purpose: Rehearsal, Name: "replay"}, true, "replay", pgx.QueryExecModeCacheStatement, false},
		{dsn + "&application_name=mine", Options{Purpose: Rehearsal, Name: "replay"}, true, "replay", pgx.QueryExecModeCacheStatement, false},
		{dsn, Options{Purpose: Test}, true, "", pgx.QueryExecModeCacheStatement, false},
		{dsn, Options{Purpose: Admin}, false, "", pgx.QueryExecModeCacheStatement, false},
		{dsn, Options{Purpose: Application, Name: "app", ExecMode: pgx.QueryExecModeSimpleProtocol}, false, "app", pgx.QueryExecModeSimpleProtocol, false},
		{dsn, Options{Purpose: Raw}, false, "", pgx.QueryExecModeCacheStatement, false},
	} {
		t.Run(tc.o.Purpose.String(), func(t *testing.T) {
			cfg, err := Config(tc.dsn, tc.o)
			if err != nil {
				t.Fatal(err)
			}
			if got := isPinned(cfg); got != tc.pinned {
				t.Errorf("pinned %v, want %v", got, tc.pinned)
			}
			if sp, ok := cfg.RuntimeParams["search_path"]; tc.pinned && sp != SearchPath || !tc.pinned && ok {
				t.Errorf("search_path startup parameter %q (%v)", sp, ok)
			}
			if got := cfg.RuntimeParams["application_name"]; got != tc.app {
				t.Errorf("application_name %q, want %q", got, tc.app)
			}
			if cfg.DefaultQueryExecMode != tc.execMode {
				t.Errorf("exec mode %v, want %v", cfg.DefaultQueryExecMode, tc.execMode)
			}
			if tc.cancel && cfg.BuildContextWatcherHandler == nil {
				t.Error("no cancel request on a context's end")
			}
		})
	}
}

// TestConfigSettingsAndTracer: settings become startup parameters, the
// caller's tracer stays behind the pin's, and pinning twice wraps once.
func TestConfigSettingsAndTracer(t *testing.T) {
	cfg, err := Config("postgres://u@h/d", Options{Purpose: Test, Settings: map[string]string{"lock_timeout": "5s"}, Tracer: nopTracer{}})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RuntimeParams["lock_timeout"] != "5s" {
		t.Errorf("lock_timeout %q", cfg.RuntimeParams["lock_timeout"])
	}
	pt, ok := cfg.Tracer.(*pinTracer)
	if !ok || pt.next != (nopTracer{}) {
		t.Fatalf("tracer %#v, want the pin's wrapping the caller's", cfg.Tracer)
	}
	pin(cfg)
	if cfg.Tracer != pt {
		t.Error("a second pin wrapped the tracer again")
	}
	if c := withoutStartupPin(cfg); c.RuntimeParams["search_path"] != "" || !isPinned(c) {
		t.Error("withoutStartupPin: the startup parameter stays, or the per-transaction pin goes")
	}
}

// TestConfigNeverQuotesTheString: a string that does not parse is an
// ErrMalformed that holds no byte of its password, whatever the purpose.
func TestConfigNeverQuotesTheString(t *testing.T) {
	for _, p := range []Purpose{Tool, Rehearsal, Test, Admin, Application, Raw} {
		_, err := Config("postgres://u:s3cr%t@h/d", Options{Purpose: p})
		if err == nil || !errors.Is(err, ErrMalformed) || strings.Contains(err.Error(), "s3cr") {
			t.Errorf("%s: %v", p, err)
		}
		if _, err := OpenPool(context.Background(), "postgres://u:s3cr%t@h/d", Options{Purpose: p}); err == nil || strings.Contains(err.Error(), "s3cr") {
			t.Errorf("%s pool: %v", p, err)
		}
	}
}
