package pgprovider

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// StartStandby makes a streaming hot standby of s, which must be a local
// cluster (Open without a DSN and without Docker): pg_basebackup -R into a
// new directory, started on a free loopback port. Tests use it to see what
// the tool does when pointed at a standby. Close stops and removes it.
func (s *Server) StartStandby(ctx context.Context) (*Server, error) {
	if s.Kind != KindLocal {
		return nil, errors.New("a standby can only be made of a local cluster")
	}
	bin, err := FindBinDir()
	if err != nil {
		return nil, err
	}
	owner, err := unprivilegedUser()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgflow-upgrade-standby-")
	if err != nil {
		return nil, err
	}
	if err := owner.chownTree(dir); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	data := filepath.Join(dir, "data")
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "pg_basebackup"), "-D", data, "-h", s.adminURL.Hostname(),
		"-p", s.adminURL.Port(), "-U", s.adminURL.User.Username(), "-R", "-X", "stream", "-N",
		"--checkpoint=fast") // a spread checkpoint paces its writes over checkpoint_timeout: tens of seconds for nothing
	owner.apply(cmd, dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pg_basebackup: %w: %s", err, strings.TrimSpace(string(out)))
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freeLoopbackPort()
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		st, err := startPostmaster(ctx, bin, dir, data, port, owner, nil)
		if err == nil {
			st.detail = fmt.Sprintf("standby of %s on 127.0.0.1:%d", s.detail, port)
			return st, nil
		}
		lastErr = err
	}
	os.RemoveAll(dir)
	return nil, lastErr
}
