package cli

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestOnlineStatementTimeoutRerunMayPass: apply --online bounds its long
// statements itself, so a statement_timeout of the role only stops its
// short reads, depending on the load: its message must not say that a rerun
// fails the same way (a rerun went through in TestApplyEnvironmentSettings).
// Other causes keep saying it, online or not.
func TestOnlineStatementTimeoutRerunMayPass(t *testing.T) {
	timeout := func() *envError {
		return &envError{err: &pgconn.PgError{Code: "57014", Message: "canceling statement due to statement timeout"},
			cause: "a statement ran into statement_timeout 50ms, set on role r", hint: "the migration's statements take longer",
			statementTimeout: &timeoutSource{reset: `ALTER ROLE "r" RESET statement_timeout`}}
	}
	online := timeout().forOnline()
	msg := online.Error()
	if !online.mayPass() || strings.Contains(msg, "fails the same way") || !strings.Contains(msg, "may get through or stop on this timeout again") ||
		!strings.Contains(msg, "options=-cstatement_timeout=0") || !strings.Contains(msg, `ALTER ROLE "r" RESET statement_timeout`) || !strings.Contains(msg, "57014") {
		t.Errorf("apply --online, statement_timeout:\n%s", msg)
	}
	if tx := timeout(); tx.mayPass() || !strings.Contains(tx.Error(), "a rerun fails the same way") {
		t.Errorf("apply, statement_timeout:\n%s", tx.Error())
	}
	standby := (&envError{err: &pgconn.PgError{Code: "25006"}, cause: "this server is a standby", hint: "point --dsn at the primary"}).forOnline()
	if standby.mayPass() || !strings.Contains(standby.Error(), "a rerun fails the same way") {
		t.Errorf("apply --online, standby:\n%s", standby.Error())
	}
}
