//go:build !docker

package pgprovider

import (
	"context"
	"errors"
)

// ErrNoDockerEngine means no Docker engine answered (or, in this build, that
// Docker support was left out); the caller falls back to the next provider.
var ErrNoDockerEngine = errors.New("no Docker engine answers")

// openDocker: the shipped binary links no Docker client (build with
// -tags docker to let the tests and `fixtures replay` start a container).
func openDocker(context.Context, string) (*Server, error) {
	return nil, errors.Join(ErrNoDockerEngine, errors.New("built without Docker support (-tags docker adds it)"))
}
