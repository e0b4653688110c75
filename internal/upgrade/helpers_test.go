package upgrade_test

import (
	"context"
	"testing"
	"time"
)

// testCtx bounds a test: a hang fails the test instead of the binary.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}
