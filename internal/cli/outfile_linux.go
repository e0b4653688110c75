package cli

import (
	"errors"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// rename moves from to to; without replace it fails with fs.ErrExist when
// to exists (renameat2 RENAME_NOREPLACE; on a file system without it, the
// check just before is what stands).
func rename(from, to string, replace bool) error {
	if !replace {
		err := unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, unix.EEXIST):
			return fs.ErrExist
		case !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOSYS):
			return err
		}
	}
	return os.Rename(from, to)
}
