// Package upgrade_tests proves the upgrade end to end: every built-in
// scenario of fixtures/scenario (the ones `pgflow-upgrade fixtures replay`
// runs), and a randomized generator of 0.16.0 states upgraded, checked for
// survival and drained by the new worker.
package upgrade_tests

import (
	"os"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }
