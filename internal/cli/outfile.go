package cli

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Output files (`fixtures capture --out`): only regular files are written,
// atomically. A target that exists and is anything else (a symlink, a FIFO,
// a device, a directory, a socket) is refused and left untouched; an
// existing regular file is replaced only with --force. The data goes to a
// new file created exclusively (O_EXCL, mode 0600) in the target's
// directory, is fsynced, and is renamed over the target; the directory is
// fsynced too, so after exit 0 the file is on disk whole, and after any
// failure the target is what it was.

// errOutTarget marks a refused --out target (exit 2).
var errOutTarget = errors.New("refusing to write there")

// checkOutTarget returns nil when path may be written: it does not exist,
// or it is a regular file and force is set.
func checkOutTarget(path string, force bool) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("--out %s: %w", path, err)
	}
	switch mode := fi.Mode(); {
	case mode.IsRegular():
		if !force {
			return fmt.Errorf("--out %s: %w: the file exists; pass --force to replace it, or choose another name", path, errOutTarget)
		}
		return nil
	default:
		return fmt.Errorf("--out %s: %w: it exists and is %s, not a regular file; give the path of a new or regular file", path, errOutTarget, describeMode(mode))
	}
}

func describeMode(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	default:
		return "not a regular file (" + m.Type().String() + ")"
	}
}

// writeOutFile writes path through write, atomically (see above). The
// target is checked before anything is written and again right before the
// rename; without force the rename itself refuses to replace anything
// (renameat2 RENAME_NOREPLACE), so a file that appears meanwhile is kept.
func writeOutFile(path string, force bool, write func(io.Writer) error) error {
	if err := checkOutTarget(path, force); err != nil {
		return err
	}
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*") // O_RDWR|O_CREATE|O_EXCL, 0600
	if err != nil {
		return fmt.Errorf("--out %s: creating the file next to it: %w", path, err)
	}
	committed := false
	defer func() {
		if !committed {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := write(tmp); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("--out %s: flushing to disk: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("--out %s: %w", path, err)
	}
	if err := checkOutTarget(path, force); err != nil {
		return err
	}
	if err := rename(tmp.Name(), path, force); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("--out %s: %w: a file appeared there while capturing; pass --force to replace it", path, errOutTarget)
		}
		return fmt.Errorf("--out %s: %w", path, err)
	}
	committed = true
	if d, err := os.Open(dir); err == nil {
		// The rename is durable once the directory is; a failure here
		// (some file systems refuse to fsync a directory) is not fatal.
		_ = d.Sync()
		d.Close()
	}
	return nil
}
