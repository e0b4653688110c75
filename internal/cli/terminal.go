package cli

import (
	"os"

	"github.com/mattn/go-isatty"
)

// IsTerminal reports whether f is a terminal. A character device is not
// enough: /dev/null is one, and a pipeline that redirects to it is not a
// person.
func IsTerminal(f *os.File) bool {
	return isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd())
}
