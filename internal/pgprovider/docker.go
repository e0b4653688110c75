//go:build docker

package pgprovider

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/ory/dockertest/v3"
	"github.com/ory/dockertest/v3/docker"
)

// ErrNoDockerEngine means no Docker engine answered; the caller falls back
// to the next provider.
var ErrNoDockerEngine = errors.New("no Docker engine answers")

// openDocker starts a container from image when a Docker engine answers.
func openDocker(ctx context.Context, image string) (*Server, error) {
	if image == "" {
		image = DefaultDockerImage
	}
	pool, err := dockertest.NewPool("")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoDockerEngine, err)
	}
	if err := pool.Client.Ping(); err != nil {
		return nil, fmt.Errorf("%w (endpoint %s): %v", ErrNoDockerEngine, pool.Client.Endpoint(), err)
	}
	repo, tag, _ := strings.Cut(image, ":")
	if tag == "" {
		tag = "latest"
	}
	const password = "pgflow-upgrade"
	res, err := pool.RunWithOptions(&dockertest.RunOptions{
		Repository: repo,
		Tag:        tag,
		Env:        []string{"POSTGRES_PASSWORD=" + password, "POSTGRES_USER=postgres", "POSTGRES_DB=postgres"},
		Cmd:        []string{"postgres", "-c", "fsync=off", "-c", "max_connections=300"},
	}, func(hc *docker.HostConfig) {
		hc.AutoRemove = true
		hc.RestartPolicy = docker.RestartPolicy{Name: "no"}
	})
	if err != nil {
		return nil, fmt.Errorf("starting container %s: %w", image, err)
	}
	// The container removes itself if this process dies without Close.
	_ = res.Expire(3600)
	u := &url.URL{Scheme: "postgres", User: url.UserPassword("postgres", password),
		Host: res.GetHostPort("5432/tcp"), Path: "/postgres", RawQuery: "sslmode=disable"}
	s := &Server{Kind: KindDocker, adminURL: u, detail: "image " + image,
		stop: func() error { return pool.Purge(res) }}
	pool.MaxWait = 60 * time.Second
	if err := pool.Retry(func() error { return s.ping(ctx) }); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("waiting for the container's PostgreSQL: %w", err)
	}
	return s, nil
}
