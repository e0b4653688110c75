package cli_test

import (
	"bytes"
	"context"
	"os"
	"testing"

	"github.com/pgflow-upgrade/pgflow-upgrade/internal/cli"
	"github.com/pgflow-upgrade/pgflow-upgrade/internal/testdb"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

// result is what one in-process run of the tool produced.
type result struct {
	code           int
	stdout, stderr string
}

// run executes the tool in-process with an isolated environment: only the
// variables in env are visible to it.
func run(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	app := &cli.App{Stdout: &out, Stderr: &errOut, Getenv: func(k string) string { return env[k] }}
	code := app.Run(context.Background(), append([]string{"pgflow-upgrade"}, args...))
	return result{code, out.String(), errOut.String()}
}
