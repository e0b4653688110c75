package worker_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

// Every test stops its workers; goleak proves no claim loop, heartbeat or
// handler goroutine outlives them.
func TestMain(m *testing.M) {
	code := testdb.Main(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goroutines leaked: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
